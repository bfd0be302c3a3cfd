"""The bottom layer: types and pure helpers every other layer may use (messages, parameters, aggregation,
seeding, atomic files, the algorithm contract's types). It imports nothing from algorithms, engine, runtimes
or the CLI."""
