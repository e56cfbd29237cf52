"""Platforms: the native modules, CANN loading and PJRT plugin registration.

`native` records which native handler runs on which lowering platform, and
loads the built-in modules and plugin platforms on first use.
"""
