"""The tokens of a streamed answer, for the front door's log line (and so for the counts per key):
a Lua filter in the door's HAProxy that reads the `usage` of the stream's last event.

vLLM, like OpenAI, sends that usage only when the request asked for it
(`"stream_options": {"include_usage": true}`, which the door notes as `txn.stream_usage`); a
stream that did not ask carries no count, and its line still says `tokens=-/-`. The filter only
reads: it is attached to the answers of streams that asked, every byte goes on as it came, and
HAProxy's own `json_query` reads the event. An error in it is logged as a warning, never passed
to the stream.
"""

from __future__ import annotations

CONFIG = "front-door-stream-usage"  # its Compose config
FILE = "/etc/vllm-compose/front-door/stream-usage.lua"
FILTER = "stream-usage"  # `filter lua.stream-usage` in the door's frontend
ASKED = "txn.stream_usage"  # set from the request: $.stream_options.include_usage
# The answer's tokens, set here for a stream and by the door's rules for a whole JSON answer;
# its log line says them (frontdoor.LOG_FORMAT).
PROMPT = "txn.prompt"
GENERATED = "txn.generated"
USAGE = {PROMPT: "prompt_tokens", GENERATED: "completion_tokens"}  # variable -> usage's field

SCRIPT = f"""\
-- vllm-compose's front door: a streamed answer's tokens, from the `usage` of its last event.
local Usage = {{id = "stream usage", flags = filter.FLT_CFG_FL_HTX}}
Usage.__index = Usage

function Usage:new()
  return setmetatable({{tail = ""}}, Usage)
end

-- Read only the answers of streams that asked for their usage. A boolean var reads as 1 (as
-- HAProxy 2.6 gives it to Lua) or as true (a later HAProxy may).
function Usage:start_analyze(txn, chn)
  local asked = txn:get_var("{ASKED}")
  if chn:is_resp() and (asked == 1 or asked == true) then
    filter.register_data_filter(self, chn)
  end
end

-- Server-sent events end with a blank line; a part of one is kept for the next call.
local function read(self, txn, data)
  local text, last = self.tail .. data, 1
  for event, after in text:gmatch("data: ([^\\n]*)\\n\\n()") do
    last = after
    if event:find('"usage"', 1, true) then
      local prompt = txn.c:json_query(event, "$.usage.{USAGE[PROMPT]}")
      local generated = txn.c:json_query(event, "$.usage.{USAGE[GENERATED]}")
      if prompt and generated then
        txn:set_var("{PROMPT}", prompt)
        txn:set_var("{GENERATED}", generated)
      end
    end
  end
  self.tail = (#text - last < 65536) and text:sub(last) or ""
end

-- Nothing returned: every byte goes on as it came.
function Usage:http_payload(txn, msg)
  local data = msg:body()
  if data then
    local ok, err = pcall(read, self, txn, data)
    if not ok then
      core.Warning("stream usage: " .. tostring(err))
    end
  end
end

core.register_filter("{FILTER}", Usage, function(usage) return usage:new() end)
"""
