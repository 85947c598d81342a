"""Checks of template.yaml: cfn-lint, `sam validate`, the table schema, cost and security rules."""
