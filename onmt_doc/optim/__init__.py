"""Optimizers (torch.optim and torch-optimizer), learning-rate schedules and parameter groups."""
