# Benchmarks reuse the suite's fixtures (real PostgreSQL and RabbitMQ).
from tests.conftest import *  # noqa: F403
