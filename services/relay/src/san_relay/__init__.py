"""Outbox relay: publishes committed job messages to RabbitMQ with publisher confirms."""
