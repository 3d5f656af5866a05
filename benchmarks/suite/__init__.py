"""The suite's machinery: specs, the stage contract, the runner and the report."""
