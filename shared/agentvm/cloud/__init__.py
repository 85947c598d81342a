"""The cloud runtime: the composition root that the Lambda handlers share."""
