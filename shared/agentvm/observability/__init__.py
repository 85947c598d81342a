"""Optional telemetry shared by every runtime (tracing.py: OpenTelemetry traces, off by default)."""
