"""The tokens of a streamed answer, for the front door's log line (and so for the counts per key):
a Lua filter in the door's HAProxy that reads the `usage` of the stream's last event.

vLLM, like OpenAI, sends that usage only when the request asked for it
(`"stream_options": {"include_usage": true}`, which the door notes as `txn.stream_usage`). With
`metrics` on, the door asks for it itself when a streamed chat or text completion says nothing of
`stream_options` (its rules set `txn.ask_usage`): the filter puts the question first in the
request's JSON, and takes vLLM's usage event (the one with no choices) out of the answer, so the
client gets the stream it asked for and the tokens are counted all the same. A stream whose
request said `stream_options` without asking carries no count; its line says `tokens=-/-`.

Whole events go on as they come; a part of one waits for its end (vLLM writes each event whole),
or goes on past 64 KiB. HAProxy's own `json_query` reads the usage. An error in the filter is
logged as a warning and the rest of the answer passes on as it came.
"""

from __future__ import annotations

CONFIG = "front-door-stream-usage"  # its Compose config
FILE = "/etc/vllm-compose/front-door/stream-usage.lua"
FILTER = "stream-usage"  # `filter lua.stream-usage` in the door's frontend
ASKED = "txn.stream_usage"  # set from the request: $.stream_options.include_usage
ASK = "txn.ask_usage"  # set by the door's rules: the door asks for the usage (with `metrics`)
# The answer's tokens, set here for a stream and by the door's rules for a whole JSON answer;
# its log line says them (frontdoor.LOG_FORMAT).
PROMPT = "txn.prompt"
GENERATED = "txn.generated"
USAGE = {PROMPT: "prompt_tokens", GENERATED: "completion_tokens"}  # variable -> usage's field
QUESTION = '"stream_options":{"include_usage":true},'  # put after the request's first `{`

SCRIPT = f"""\
-- vllm-compose's front door: a streamed answer's tokens, from the `usage` of its last event.
local Usage = {{id = "stream usage", flags = filter.FLT_CFG_FL_HTX}}
Usage.__index = Usage

function Usage:new()
  return setmetatable({{}}, Usage)
end

-- A boolean var reads as 1 (as HAProxy 2.6 gives it to Lua) or as true (a later HAProxy may).
local function said(txn, name)
  local value = txn:get_var(name)
  return value == 1 or value == true
end

-- The door's rules have run: it asks for the usage when they say so.
function Usage:http_headers(txn, msg)
  if not msg.channel:is_resp() and said(txn, "{ASK}") then
    self.asking = true
    filter.register_data_filter(self, msg.channel)
  end
end

-- Only the answers of streams with a usage to read.
function Usage:start_analyze(txn, chn)
  if chn:is_resp() and (self.asking or said(txn, "{ASKED}")) then
    filter.register_data_filter(self, chn)
  end
end

-- The question, once, after the request's first brace (the body is buffered whole).
local function ask(self, _, msg)
  if not self.asked and msg:input() > 0 then
    local brace = (msg:body(0, 64) or ""):find("{{", 1, true)
    if brace then
      msg:insert('{QUESTION}', brace)
    end
    self.asked = true
  end
  msg:forward(msg:input())
end

-- Server-sent events end with a blank line: whole ones go on, a part of one waits for the rest.
local function answer(self, txn, msg)
  local data, removed, upto = msg:body() or "", 0, 0
  for first, event, after in data:gmatch("()data: ([^\\n]*)\\n\\n()") do
    if event:find('"usage"', 1, true) then
      local prompt = txn.c:json_query(event, "$.usage.{USAGE[PROMPT]}")
      local generated = txn.c:json_query(event, "$.usage.{USAGE[GENERATED]}")
      if prompt and generated then
        txn:set_var("{PROMPT}", prompt)
        txn:set_var("{GENERATED}", generated)
        if self.asking and event:find('"choices":%s*%[%s*%]') then
          msg:remove(first - 1 - removed, after - first)  -- the client did not ask for it
          removed = removed + after - first
        end
      end
    end
    upto = after - 1 - removed
  end
  if msg:eom() or msg:input() - upto > 65536 then
    upto = msg:input()
  end
  msg:forward(upto)
end

function Usage:http_payload(txn, msg)
  local work = msg.channel:is_resp() and answer or ask
  local ok, err = pcall(work, self, txn, msg)
  if not ok then
    core.Warning("stream usage: " .. tostring(err))
    msg:forward(msg:input())
    filter.unregister_data_filter(self, msg.channel)
  end
  return filter.WAIT
end

core.register_filter("{FILTER}", Usage, function(usage) return usage:new() end)
"""
