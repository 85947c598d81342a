from tests.aws_fixtures import aws_env, aws_session, moto_endpoint

__all__ = ["aws_env", "aws_session", "moto_endpoint"]
