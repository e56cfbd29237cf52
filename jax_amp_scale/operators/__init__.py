"""The operators, one module each: update_scale, unscale_and_check, host_report."""
