"""Job types, the message envelope, registration and the job repository."""
