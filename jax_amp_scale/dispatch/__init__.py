"""The backend choice: one rule, one table, for both operators."""
