"""The multiplexing turn-host tier: one long-lived asyncio process runs many sessions' turns at once
(`python -m agentvm.turnhost`, an ECS Fargate service scaled 0..N, fed by an SQS queue).

A turn on `chat_turn` bills Lambda for its whole wall time, most of it spent waiting on the LLM; a
host waits on hundreds of streams at once for the price of one small task. Each request it takes runs
exactly what one `chat_turn` invocation runs (`CloudRuntime.run_session`: the `SessionWorker` under the
session's DynamoDB lease), so every guarantee of the lease protocol holds unchanged: one publisher per
session, release-then-recheck, dead-runner recovery by the next runner or the turn sweep.
"""
