"""The operators (`operators`) and the choice of backend that runs them (`dispatch`).

`dispatch` holds one rule and one immutable configuration for both
operators; `dispatch.configured` is the one seam that changes it for a
block (the Ascend-on-CPU test harness).
"""
