"""The round loop's building blocks: messages, seeding, parameter selection, local training, aggregation."""
