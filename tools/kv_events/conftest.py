"""Says which vLLM struct definitions the KV-event tests checked against: vLLM's own source
(VLLM_SRC, which tools/test.sh sets when ../shared/vllm exists) or the built-in copy."""
import vllm_schema


def pytest_terminal_summary(terminalreporter):
    schema = vllm_schema.Schema.load()
    terminalreporter.write_line(f"kv_events: events checked against {schema.source}")
