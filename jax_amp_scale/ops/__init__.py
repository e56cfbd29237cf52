"""The operators: validate once, ask `dispatch` for a plan, run the reference or the custom call."""
