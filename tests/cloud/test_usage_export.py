"""The scheduled `usage_export` function (moto): the day before the run, and its month to date, of
every tenant, as FOCUS 1.0 CSV under exports/focus/ in the bucket."""

from __future__ import annotations

import calendar
import csv
import io
import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import boto3
import pytest

from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import Usage
from agentvm.domain.usage import UsageRecord
from agentvm.money import cost_of
from agentvm.services.usage_export import focus_csv
from tests.cloud.conftest import cloud_runtime_on
from tests.support.cloud_edge import load_handler
from tests.support.focus import assert_valid_focus


@pytest.fixture
def cloud(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[cloud_runtime.CloudRuntime]:
    bucket = f"agentvm-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    with cloud_runtime_on(monkeypatch, moto_endpoint, AVM_BUCKET=bucket) as rt:
        yield rt


def record(tenant: str, n: int, day: int, usage: Usage) -> UsageRecord:
    at = calendar.timegm((2026, 11, day, 12, 0, 0)) * 1000
    cost = cost_of(usage, "claude-haiku-4-5")
    return UsageRecord(f"turn_{tenant}_{n}#llm#1", tenant, None, "cont_1", "img_1", "sess_1", f"turn_{tenant}_{n}",
                       "llm", "anthropic", "claude-haiku-4-5", usage, cost.list, cost.billed, "function",
                       "completed", at - 900, at)


def test_the_daily_run_writes_the_day_and_the_month_to_date(cloud: cloud_runtime.CloudRuntime,
                                                            moto_endpoint: str, tmp_path: Path) -> None:
    records = [record("acme", 1, 4, Usage(100, 10)), record("acme", 2, 5, Usage(200, 20, 50)),
               record("globex", 1, 5, Usage(300, 30)), record("globex", 2, 6, Usage(400, 40))]
    for r in records:
        assert cloud_runtime.run(cloud.meter.ledger.settle(r, reserved=Decimal(0), reserved_period="2026-11",
                                                           key_held=False))
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = cloud.settings.bucket
    handler = load_handler("usage_export")
    out = handler.handler({"day": "2026-11-05"}, None)
    month_bytes = s3.head_object(Bucket=bucket, Key="exports/focus/monthly/2026-11.csv")["ContentLength"]
    # one row per charged token class: the 5th has 3 + 2 rows; the 4th (and the 1st to the 3rd, empty),
    # without a file yet, are written too; the month is joined from the days 1 to 5
    assert out == {"day": "2026-11-05", "files": {"exports/focus/daily/2026-11-05.csv": 5,
                                                  **{f"exports/focus/daily/2026-11-0{d}.csv": 0 for d in (1, 2, 3)},
                                                  "exports/focus/daily/2026-11-04.csv": 2},
                   "monthly": {"key": "exports/focus/monthly/2026-11.csv", "days": 5, "through": "2026-11-05",
                               "bytes": month_bytes}, "missing": []}
    assert handler.handler({"day": "2026-11-06"}, None)["files"] == {"exports/focus/daily/2026-11-06.csv": 2}

    def rows(key: str) -> list[dict[str, str]]:
        body = s3.get_object(Bucket=bucket, Key=key)
        assert body["ContentType"] == "text/csv"
        return list(csv.DictReader(io.StringIO(body["Body"].read().decode())))

    daily = rows("exports/focus/daily/2026-11-05.csv")
    assert sorted((r["BillingAccountId"], r["SkuId"]) for r in daily) == [
        ("acme", "anthropic/claude-haiku-4/cache-read"), ("acme", "anthropic/claude-haiku-4/input"),
        ("acme", "anthropic/claude-haiku-4/output"), ("globex", "anthropic/claude-haiku-4/input"),
        ("globex", "anthropic/claude-haiku-4/output")]
    assert sum(Decimal(r["BilledCost"]) for r in daily) == records[1].billed_cost + records[2].billed_cost
    monthly = rows("exports/focus/monthly/2026-11.csv")  # to the 6th: every record
    assert sum(Decimal(r["BilledCost"]) for r in monthly) == sum(r.billed_cost for r in records)
    assert {r["BillingPeriodStart"] for r in monthly} == {"2026-11-01T00:00:00Z"}
    # the streamed file: charge-time order, each record's rows as the small export writes them
    text = s3.get_object(Bucket=bucket, Key="exports/focus/monthly/2026-11.csv")["Body"].read().decode()
    assert text == focus_csv(records[:1], billing_period="2026-11") + "".join(
        focus_csv([rec], billing_period="2026-11").split("\n", 1)[1] for rec in records[1:])
    assert_valid_focus(text, tmp_path / "monthly.csv")  # the official validator (.venv-focus)


def test_a_bad_day_is_refused_with_the_field_named(cloud: cloud_runtime.CloudRuntime) -> None:
    handler = load_handler("usage_export")
    from agentvm.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="day: no such month: 2026-13-01"):
        handler.handler({"day": "2026-13-01"}, None)


def test_the_http_api_serves_each_tenant_its_usage_budgets_and_logs(cloud: cloud_runtime.CloudRuntime) -> None:
    from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
    from agentvm.auth.api_keys import new_key
    from tests.cloud.test_handlers import http_event

    acme_key, acme = new_key("acme", ("admin",))
    globex_key, globex = new_key("globex")
    for key in (acme_key, globex_key):
        cloud_runtime.run(DynamoDBKeys(cloud.store).put_key(key))
    for r in (record("acme", 1, 4, Usage(100, 10)), record("acme", 2, 5, Usage(200, 20))):
        cloud_runtime.run(cloud.meter.ledger.settle(r, reserved=Decimal(0), reserved_period="2026-11", key_held=False))
    api = load_handler("http_api")

    def call(method: str, path: str, token: str, query: str = "", body: object = None) -> tuple[int, str]:
        res = api.handler(http_event(method, path, token=token, query=query, body=body), None)
        return res["statusCode"], res["body"]

    status, body = call("GET", "/v1/usage", acme, "period=2026-11&groupBy=day")
    assert status == 200 and '"2026-11-04"' in body and '"2026-11-05"' in body
    status, body = call("GET", "/v1/usage", globex, "period=2026-11")
    assert status == 200 and '"rows":[]' in body and "acme" not in body
    status, body = call("GET", "/v1/usage/export", globex, "period=2026-11")
    assert status == 200 and body.count("\n") == 1  # the header only
    assert call("PUT", "/v1/budgets", globex, body={"monthlyBudget": "5"})[0] == 403  # a user key
    status, body = call("PUT", "/v1/budgets", acme, body={"monthlyBudget": "5"})
    assert status == 200 and '"monthlyBudget":"5"' in body
    assert call("GET", "/v1/logs", acme)[0] == 200


def test_the_http_api_reads_a_tenants_metrics_from_the_turn_log(cloud: cloud_runtime.CloudRuntime) -> None:
    from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
    from agentvm.auth.api_keys import new_key
    from agentvm.domain.models import Checkpoint, Turn, TurnStatus
    from agentvm.ids import now_ms
    from tests.cloud.test_handlers import http_event

    acme_key, acme = new_key("acme")
    other_key, other = new_key("globex")
    for key in (acme_key, other_key):
        cloud_runtime.run(DynamoDBKeys(cloud.store).put_key(key))
    now = now_ms()
    turns = [Turn("acme", f"turn_{i}", "sess_1", "img_1", "cont_1", f"m{i}", status, now - 5_000 + i,
                  usage=Usage(100 * (i + 1), 10), started_at=now - 5_000, ended_at=now - 5_000 + ms,
                  first_token_ms=first)
             for i, (status, ms, first) in enumerate([
                 (TurnStatus.COMPLETED, 1_000, 300), (TurnStatus.COMPLETED, 2_000, 100),
                 (TurnStatus.FAILED, 3_000, None),  # no text streamed
                 (TurnStatus.COMPLETED, 4_000, 900)])]
    cloud_runtime.run(cloud.store.commit(Checkpoint("acme", "sess_1", turns=turns)))
    api = load_handler("http_api")

    def metrics(token: str, window: str = "all") -> dict[str, object]:
        res = api.handler(http_event("GET", "/v1/metrics", token=token, query=f"window={window}"), None)
        assert res["statusCode"] == 200, res["body"]
        return dict(json.loads(res["body"]))

    got = metrics(acme, "5m")
    assert got["turns"] == {"total": 4, "completed": 3, "failed": 1, "interrupted": 0}
    assert (got["successRate"], got["errorRate"]) == (0.75, 0.25)
    assert got["tokens"] == {"input": 1000, "output": 40, "cacheRead": 0, "cacheWrite": 0}
    assert got["latencyMs"] == {"firstToken": {"p50": 300, "p95": 900, "samples": 3},
                                "turn": {"p50": 2000, "p95": 4000, "samples": 4}}
    assert got["active"] == {"containers": None, "connections": None}  # CloudWatch's, not the turn log's
    assert metrics(other)["turns"] == {"total": 0, "completed": 0, "failed": 0, "interrupted": 0}
    bad = api.handler(http_event("GET", "/v1/metrics", token=acme, query="window=2d"), None)
    assert bad["statusCode"] == 400 and "window" in bad["body"]
