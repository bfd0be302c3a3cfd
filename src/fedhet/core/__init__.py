"""The ground floor of the method stack: types and pure helpers every method, the engine and the runtimes use
(messages, parameters, aggregation, seeding, batches, the algorithm contract's types). Below it are only the
foundation units (errors, config, ...; tests/test_layers.py orders them); `fedhet.core.contract` loads neither
the data layer nor the model zoo (fedhet.core.protocols)."""
