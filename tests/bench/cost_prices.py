"""us-east-1 list prices for the cost model (tests/bench/cost_model.py), each with its source and date.

One table, `US_EAST_1`: first pricing tier of each (every quantity the model prices is far below the
next tier: 1 billion WebSocket messages, 7.5 billion GB-s, 10 TB, 10,000 metrics). "not re-verified
offline" marks figures kept as AWS listed them in 2025 where no stored copy of the page confirmed them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

D = Decimal
MILLION = D(1_000_000)


@dataclass(frozen=True)
class Price:
    """`amount` USD per `per` units of `unit`, with where it comes from."""

    name: str
    amount: Decimal
    per: Decimal
    unit: str
    source: str
    as_of: str
    free_tier: Decimal = field(default=D(0))  # units a month the free tier covers (never subtracted)
    free_tier_kind: str = ""  # "always free" or "12 months, accounts opened before 2025-07-15"

    def cost(self, quantity: Decimal) -> Decimal:
        return quantity * self.amount / self.per

    @property
    def unit_price(self) -> Decimal:
        """USD per one unit (exact: every `per` is a power of ten)."""
        return self.amount / self.per

    def label(self) -> str:
        per = "" if self.per == 1 else f"{self.per:,.0f} "
        return f"${self.amount} / {per}{self.unit}"


_APIGW = "https://aws.amazon.com/api-gateway/pricing/"
_LAMBDA = "https://aws.amazon.com/lambda/pricing/"
_DDB = "https://aws.amazon.com/dynamodb/pricing/on-demand/"
_CW = "https://aws.amazon.com/cloudwatch/pricing/"
_S3 = "https://aws.amazon.com/s3/pricing/"
_EC2 = "https://aws.amazon.com/ec2/pricing/on-demand/"
_SM = "https://aws.amazon.com/secrets-manager/pricing/"
_SQS = "https://aws.amazon.com/sqs/pricing/"
_FARGATE = "https://aws.amazon.com/fargate/pricing/"
_ECR = "https://aws.amazon.com/ecr/pricing/"
_VPC = "https://aws.amazon.com/vpc/pricing/"
_ELB = "https://aws.amazon.com/elasticloadbalancing/pricing/"
_UNVERIFIED = "as listed by AWS in 2025; not re-verified offline"
# Fargate Spot has no fixed price: AWS lists a current Spot price per region that moves with supply and
# demand ("up to 70 %" off on-demand; 50-70 % seen). Assumed: 67 % off the Linux/ARM on-demand prices,
# the discount seen on eu-west-1 Spot since 2020 (tomgregory.com: $0.01334053 against $0.04048 a
# vCPU-hour) and about what AWS listed in 2025 (elasticscale.com, January 2025: 69 %).
FARGATE_SPOT_DISCOUNT = D("0.67")
_SPOT_AS_OF = ("assumed 2026-11: on-demand × (1 − 0.67); Spot prices vary by region and over time "
               "(fortem.dev 2026-06: 50-70 % off; elasticscale.com 2025-01: 69 %)")
_LEGACY_FREE = "12 months, accounts opened before 2025-07-15"
_ALWAYS = "always free"


@dataclass(frozen=True)
class Prices:
    ws_message: Price
    ws_connection_minute: Price
    lambda_request: Price
    lambda_gb_s: Price
    snapstart_cache_gb_s: Price
    snapstart_restore_gb: Price
    ddb_write_unit: Price
    ddb_read_unit: Price
    ddb_storage_gb_month: Price
    ddb_pitr_gb_month: Price
    logs_ingest_gb: Price
    logs_storage_gb_month: Price
    custom_metric_month: Price
    alarm_month: Price
    s3_storage_gb_month: Price
    s3_glacier_ir_gb_month: Price
    s3_put: Price
    s3_get: Price
    s3_transition_glacier_ir: Price
    sqs_request: Price
    transfer_out_gb: Price
    secret_month: Price
    secret_api_call: Price
    fargate_arm_vcpu_hour: Price
    fargate_arm_gb_hour: Price
    fargate_spot_arm_vcpu_hour: Price
    fargate_spot_arm_gb_hour: Price
    public_ipv4_hour: Price
    alb_hour: Price
    alb_lcu_hour: Price
    ecr_storage_gb_month: Price

    def all(self) -> list[Price]:
        return [getattr(self, f) for f in self.__dataclass_fields__]


US_EAST_1 = Prices(
    ws_message=Price("API Gateway WebSocket message", D("1.00"), MILLION, "messages", _APIGW,
                     "2026 (first 1 billion a month, metered per 32 KB; awsforengineers.com 2025-05-19)",
                     D(1_000_000), _LEGACY_FREE),
    ws_connection_minute=Price("API Gateway WebSocket connection minute", D("0.25"), MILLION, "connection minutes",
                               _APIGW, "2026 (repost.aws quoting the AWS page)", D(750_000), _LEGACY_FREE),
    lambda_request=Price("Lambda request", D("0.20"), MILLION, "requests", _LAMBDA,
                         "2026 (cloudchipr.com 2024; the AWS free-tier text)", D(1_000_000), _ALWAYS),
    lambda_gb_s=Price("Lambda duration, arm64", D("0.0000133334"), D(1), "GB-s", _LAMBDA,
                      "2026 (first 7.5 billion GB-s a month; cloudchipr.com 2024)", D(400_000), _ALWAYS),
    snapstart_cache_gb_s=Price("Lambda SnapStart cache (Python)", D("0.0000015046"), D(1), "GB-s", _LAMBDA,
                               "2026 (awsnegotiations.com 2026-05); billed per published version kept"),
    snapstart_restore_gb=Price("Lambda SnapStart restore (Python)", D("0.0001397998"), D(1), "GB restored", _LAMBDA,
                               "2026 (awsnegotiations.com 2026-05)"),
    ddb_write_unit=Price("DynamoDB on-demand write request unit", D("0.625"), MILLION, "WRU", _DDB,
                         "2026 (since the 2024-11-01 cut; airbyte.com 2025-07-21)"),
    ddb_read_unit=Price("DynamoDB on-demand read request unit", D("0.125"), MILLION, "RRU", _DDB,
                        "2026 (since the 2024-11-01 cut; airbyte.com 2025-07-21)"),
    ddb_storage_gb_month=Price("DynamoDB Standard storage", D("0.25"), D(1), "GB-month",
                               "https://aws.amazon.com/dynamodb/pricing/", "2026 (AWS page: first 25 GB free)",
                               D(25), _ALWAYS),
    ddb_pitr_gb_month=Price("DynamoDB point-in-time recovery", D("0.20"), D(1), "GB-month", _DDB,
                            "2026 (finops.com.py)"),
    logs_ingest_gb=Price("CloudWatch Logs ingestion (standard)", D("0.50"), D(1), "GB", _CW,
                         "2026 (Lambda logs tiered since 2025-05-01, first tier unchanged; c3x.dev 2026-06)",
                         D(5), _ALWAYS),
    logs_storage_gb_month=Price("CloudWatch Logs storage", D("0.03"), D(1), "GB-month", _CW,
                                "2026 (c3x.dev 2026-06)", D(5), _ALWAYS),
    custom_metric_month=Price("CloudWatch custom metric", D("0.30"), D(1), "metric-months", _CW,
                              "2026 (first 10,000 metrics; prorated by the hour, billed only in hours with data; "
                              "vantage.sh, cal53 calculator)", D(10), _ALWAYS),
    alarm_month=Price("CloudWatch alarm (standard resolution)", D("0.10"), D(1), "alarm-months", _CW, _UNVERIFIED,
                      D(10), _ALWAYS),
    s3_storage_gb_month=Price("S3 Standard storage", D("0.023"), D(1), "GB-month", _S3,
                              "2026 (first 50 TB; cloudburn.io 2026-03)", D(5), _LEGACY_FREE),
    s3_glacier_ir_gb_month=Price("S3 Glacier Instant Retrieval storage", D("0.004"), D(1), "GB-month", _S3,
                                 _UNVERIFIED + "; 128 KB minimum billable object size, 90-day minimum"),
    s3_put=Price("S3 PUT request", D("0.005"), D(1000), "requests", _S3, "2026 (devnotes.tech)"),
    s3_get=Price("S3 GET request", D("0.0004"), D(1000), "requests", _S3, "2026 (devnotes.tech)"),
    s3_transition_glacier_ir=Price("S3 lifecycle transition to Glacier IR", D("0.02"), D(1000), "transitions", _S3,
                                   _UNVERIFIED),
    sqs_request=Price("SQS standard request (per 64 KB)", D("0.40"), MILLION, "requests", _SQS,
                      "2026 (first 100 billion; cloudburn.io 2026-03, factualminds.com 2026-06)", D(1_000_000),
                      _ALWAYS),
    transfer_out_gb=Price("Data transfer out to the internet", D("0.09"), D(1), "GB", _EC2,
                          "2026 (first 10 TB; awsforengineers.com 2025-05-19)", D(100), _ALWAYS),
    secret_month=Price("Secrets Manager secret", D("0.40"), D(1), "secret-months", _SM, _UNVERIFIED),
    secret_api_call=Price("Secrets Manager API call", D("0.05"), D(10_000), "calls", _SM, _UNVERIFIED),
    fargate_arm_vcpu_hour=Price("Fargate Linux/ARM vCPU", D("0.03238"), D(1), "vCPU-hours", _FARGATE,
                                "2026 (vantage.sh; cloudburn.io 2026-04); per second, 1 minute minimum"),
    fargate_arm_gb_hour=Price("Fargate Linux/ARM memory", D("0.00356"), D(1), "GB-hours", _FARGATE,
                              "2026 (vantage.sh; cloudburn.io 2026-04)"),
    fargate_spot_arm_vcpu_hour=Price("Fargate Spot Linux/ARM vCPU", D("0.03238") * (1 - FARGATE_SPOT_DISCOUNT), D(1),
                                     "vCPU-hours", _FARGATE, _SPOT_AS_OF),
    fargate_spot_arm_gb_hour=Price("Fargate Spot Linux/ARM memory", D("0.00356") * (1 - FARGATE_SPOT_DISCOUNT), D(1),
                                   "GB-hours", _FARGATE, _SPOT_AS_OF),
    public_ipv4_hour=Price("Public IPv4 address", D("0.005"), D(1), "address-hours", _VPC,
                           _UNVERIFIED + " (charged since 2024-02-01)"),
    alb_hour=Price("Application Load Balancer", D("0.0225"), D(1), "ALB-hours", _ELB, _UNVERIFIED),
    alb_lcu_hour=Price("Application Load Balancer capacity unit", D("0.008"), D(1), "LCU-hours", _ELB,
                       _UNVERIFIED + " (an LCU: 25 new connections/s, 3,000 active connections, 1 GB/h to IP targets)"),
    ecr_storage_gb_month=Price("ECR private repository storage", D("0.10"), D(1), "GB-month", _ECR, _UNVERIFIED),
)
