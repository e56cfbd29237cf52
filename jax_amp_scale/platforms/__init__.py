"""Platforms: the native modules, CANN loading and PJRT plugin registration.

`registry` records which native handler runs on which lowering platform;
`native` loads the built-in modules and plugin platforms on first use.
"""
