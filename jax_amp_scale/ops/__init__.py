"""The operators: check the inputs, ask `dispatch` for a plan, run the reference or the custom call.

`dispatch` holds the backend choice: one rule and one immutable
configuration for both operators; `dispatch.configured` is the one seam
that changes it for a block (the Ascend-on-CPU test harness).
"""
