"""Context parallelism: sharding, communication, LSE merge and one module per method."""
