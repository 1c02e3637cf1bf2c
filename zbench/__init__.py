"""zbench: the workbench around zero_core (CLI, models, data, runners, reports)."""

__version__ = "0.1.0"
