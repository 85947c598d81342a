"""The turn engine: context building, driver loop, tool loop, event assembly, delta coalescing."""
