"""Budgets (G1–G6): their windows, the shared store of spend and
reservations, where each stands, the options a budget takes, the alerts it
raises, and their admin."""
