#!/bin/sh
# chat_stream: the Lambda Web Adapter (a layer, started through AWS_LAMBDA_EXEC_WRAPPER) runs this
# script once per execution environment and proxies every invocation to the app on $AWS_LWA_PORT,
# streaming the response (AWS_LWA_INVOKE_MODE=response_stream). The agentvm package comes from the
# AgentVM layer (/opt/python); uvicorn and click are in this function's package (LAMBDA_TASK_ROOT).
export PYTHONPATH="${LAMBDA_TASK_ROOT:-/var/task}:/opt/python${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m uvicorn --factory agentvm.cloud.stream_app:create_stream_app \
  --host 127.0.0.1 --port "${AWS_LWA_PORT:-8000}" --no-access-log --log-level warning --timeout-keep-alive 75
