#!/usr/bin/env python3
"""Writes cases.json: the conversations x flags that compare_reference.sh renders with both
moeinfer and @huggingface/jinja. Rerun after editing; the JSON is what the test reads."""
import json

NOW = 1767225600  # 2026-01-01T00:00:00Z, the date strftime_now() sees in both renderers

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "description": "Forecast days"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "move_to", "description": "Move the robot arm",
        "parameters": {"type": "object", "properties": {
            "x": {"type": "number"}, "y": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "fast": {"type": "boolean"}},
            "required": ["x", "y"]}}},
]

def call(name, args, as_text=False, cid="call_1"):
    return {"type": "function", "id": cid,
            "function": {"name": name, "arguments": json.dumps(args) if as_text else args}}

SYS = {"role": "system", "content": "You are a helpful NPC in a fantasy game. Stay in character."}
U1 = {"role": "user", "content": "Hello! Who are you?"}
A1 = {"role": "assistant", "content": "I am Bram, the blacksmith of Eldor."}
U2 = {"role": "user", "content": "Can you forge me a sword?"}
U_UNI = {"role": "user", "content": "Ünïcödé ✓ 日本語 \"quotes\" and 'apostrophes' \\ backslash\ttab"}

def conversations(tool_content):
    """tool_content: what an assistant turn with only tool calls carries as content."""
    weather = call("get_weather", {"city": "Paris", "unit": "celsius", "days": 2})
    move = call("move_to", {"x": 1.5, "y": -2, "tags": ["a", "b"], "fast": True}, cid="call_2")
    return {
        "single": [U1],
        "system": [SYS, U1],
        "multi": [SYS, U1, A1, U2],
        "multi_nosys": [U1, A1, U2],
        "reasoning": [U1, {"role": "assistant", "content": "I am Bram.", "reasoning_content": "The user asks who I am."},
                      U2, {"role": "assistant", "content": "Yes, for 10 gold.", "reasoning_content": "Swords cost 10 gold."}],
        "reasoning_open": [SYS, U1, {"role": "assistant", "content": "I am Bram.", "reasoning_content": "Introduce myself."}, U2],
        "tool": [U1, {"role": "assistant", "content": tool_content, "tool_calls": [weather]},
                 {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}", "tool_call_id": "call_1", "name": "get_weather"},
                 {"role": "assistant", "content": "It is 21 degrees and clear in Paris."}],
        "tool_pending": [SYS, U2, {"role": "assistant", "content": tool_content, "tool_calls": [weather]},
                         {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}],
        "two_tools": [U1, {"role": "assistant", "content": tool_content, "tool_calls": [weather, move]},
                      {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"},
                      {"role": "tool", "content": "moved", "tool_call_id": "call_2", "name": "move_to"},
                      {"role": "assistant", "content": "Done."}, U2],
        "unicode": [SYS, U_UNI, {"role": "assistant", "content": "Réponse: «ok» 👍"}, U_UNI],
    }

def case(family, template, name, msgs, gen, think, tools=False, extra=None, bos="", eos="", expect_error=False):
    c = {"id": f"{template.replace('.jinja', '')}-{name}-gen{int(gen)}-think{think}{'-tools' if tools else ''}",
         "family": family, "template": template, "messages": msgs, "add_generation_prompt": gen,
         "enable_thinking": think, "bos_token": bos, "eos_token": eos, "now_unix": NOW}
    if tools:
        c["tools"] = TOOLS
    if extra:
        c["extra"] = extra
        c["id"] += "-" + "-".join(sorted(extra))
    if expect_error:
        c["expect_error"] = True
    return c

def main():
    cases = []
    # Qwen3 (Qwen3-30B-A3B) and Qwen3.5: one family, two templates.
    qc = conversations("")
    for t in ("qwen3.jinja", "qwen3.5.jinja"):
        f = lambda *a, **k: cases.append(case("qwen", t, *a, bos="<|endoftext|>", eos="<|im_end|>", **k))
        f("single", qc["single"], True, -1)
        f("single", qc["single"], True, 0)
        f("single", qc["single"], True, 1)
        f("system", qc["system"], False, -1)
        f("multi", qc["multi"], True, 0)
        f("multi_nosys", qc["multi_nosys"], True, -1, tools=True)
        f("reasoning", qc["reasoning"], False, -1)
        f("reasoning_open", qc["reasoning_open"], True, 1)
        f("tool", qc["tool"], False, -1, tools=True)
        f("tool_pending", qc["tool_pending"], True, 0, tools=True)
        f("two_tools", qc["two_tools"], True, -1, tools=True)
        f("unicode", qc["unicode"], True, -1)
    cases.append(case("qwen", "qwen3.5.jinja", "reasoning", qc["reasoning"], False, -1,
                      extra={"preserve_thinking": True}))
    cases.append(case("qwen", "qwen3.5.jinja", "no_user", [SYS], True, -1, expect_error=True))
    # Qwen3 also accepts tool-call arguments as JSON text.
    text_args = [U1, {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Oslo"}, as_text=True)]},
                 {"role": "tool", "content": "rain"}]
    cases.append(case("qwen", "qwen3.jinja", "text_args", text_args, True, -1, tools=True))

    # DeepSeek-V3: arguments are JSON text; a tool-call turn has content none.
    dc = conversations(None)
    for conv in ("tool", "tool_pending", "two_tools"):
        for m in dc[conv]:
            for tc in m.get("tool_calls", []):
                tc["function"]["arguments"] = json.dumps(tc["function"]["arguments"])
    f = lambda *a, **k: cases.append(case("deepseek", "deepseek-v3.jinja", *a, bos="<｜begin▁of▁sentence｜>",
                                          eos="<｜end▁of▁sentence｜>", **k))
    f("single", dc["single"], True, -1)
    f("single", dc["single"], False, -1)
    f("system", dc["system"], True, -1)
    f("multi", dc["multi"], True, -1)
    f("multi_nosys", dc["multi_nosys"], False, -1)
    f("two_systems", [SYS, {"role": "system", "content": "Speak briefly."}, U1], True, -1)
    f("tool", dc["tool"], True, -1)
    f("tool_pending", dc["tool_pending"], True, -1)
    f("two_tools", dc["two_tools"], True, -1)
    f("unicode", dc["unicode"], True, -1)

    # GLM-4.7: arguments are objects.
    gc = conversations("")
    f = lambda *a, **k: cases.append(case("glm", "glm-4.7.jinja", *a, bos="[gMASK]", eos="<|endoftext|>", **k))
    f("single", gc["single"], True, -1)
    f("single", gc["single"], True, 0)
    f("system", gc["system"], True, 1)
    f("multi", gc["multi"], False, -1)
    f("reasoning", gc["reasoning"], False, -1)
    f("reasoning", gc["reasoning"], True, -1, extra={"clear_thinking": False})
    f("reasoning_open", gc["reasoning_open"], True, 0, tools=True)
    f("tool", gc["tool"], False, -1, tools=True)
    f("tool_pending", gc["tool_pending"], True, 1, tools=True)
    f("two_tools", gc["two_tools"], True, -1, tools=True)
    f("unicode", gc["unicode"], True, -1)
    f("think_inline", [U1, {"role": "assistant", "content": "<think>\nhidden plan\n</think>\n\nVisible answer."}], False, -1)

    # gpt-oss (harmony): reasoning is `thinking`; arguments are objects; content is a string.
    oc = conversations("")
    f = lambda *a, **k: cases.append(case("gpt-oss", "gpt-oss.jinja", *a, bos="<|startoftext|>", eos="<|return|>", **k))
    f("single", oc["single"], True, -1)
    f("system", oc["system"], True, -1)
    f("multi", oc["multi"], True, -1, extra={"reasoning_effort": "high"})
    f("multi_nosys", oc["multi_nosys"], False, -1)
    f("reasoning", oc["reasoning"], False, -1)
    f("tool", [U1, {"role": "assistant", "content": "", "reasoning_content": "Need the weather.",
                    "tool_calls": [call("get_weather", {"city": "Paris"})]},
               {"role": "tool", "content": "sunny"}], True, -1, tools=True)
    f("tool", oc["tool"], False, -1, tools=True)
    f("tool_pending", oc["tool_pending"], True, -1, tools=True, extra={"model_identity": "You are Bram."})
    f("builtin", oc["system"], True, -1, extra={"builtin_tools": ["browser", "python"], "reasoning_effort": "low"})
    f("unicode", oc["unicode"], True, -1, tools=True)
    f("channel_in_content", [U1, {"role": "assistant", "content": "<|channel|>final<|message|>hi"}], False, -1,
      expect_error=True)

    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    with open(__file__.replace("make_cases.py", "cases.json"), "w", encoding="utf-8") as fh:
        json.dump(cases, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    print(len(cases), "cases")

main()
