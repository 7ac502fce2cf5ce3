"""Service level objectives: error budgets and multiwindow, multi-burn-rate alerts."""
