"""The one trainer, distributed setup and reporting."""
