"""RabbitMQ: names and topology."""
