"""AWS adapters (DynamoDB, S3, API Gateway, Lambda); filled by the cloud tier."""
