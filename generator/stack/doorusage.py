"""The door's Lua filter of streamed answers (text/event-stream), in its HAProxy: it reads the
tokens from the `usage` of the stream's last event, for the door's log line (and so for the counts
per key), and it ends a stream the model server broke off with an error event in OpenAI's shape.

The tokens: vLLM, like OpenAI, sends that usage only when the request asked for it
(`"stream_options": {"include_usage": true}`, which the door notes as `txn.stream_usage`). With
`metrics` on, the door asks for it itself when a streamed chat or text completion says nothing of
`stream_options` (its rules set `txn.ask_usage`): the filter puts the question first in the
request's JSON, and takes vLLM's usage event (the one with no choices) out of the answer, so the
client gets the stream it asked for and the tokens are counted all the same. A stream whose
request said `stream_options` without asking carries no count; its line says `tokens=-/-`.

The end: when the model server closes in the middle of a stream (the head's vLLM killed), the
client gets CUT, an error event and `[DONE]`, and the answer ends as a whole one does, instead of
a connection closed mid-answer. HAProxy 3.0 and later call the filter once more after the
server's close (the request's side is then done and the answer can take no more); HAProxy 2.6
does not, and there such a stream is still cut. Either way the log line says `SD`, a server abort
in the data phase, which mtail counts as cut (doorcounts.py).

Whole events go on as they come; a part of one waits for its end (vLLM writes each event whole),
or goes on past 64 KiB. HAProxy's own `json_query` reads the usage. An error in the filter is
logged as a warning and the rest of the answer passes on as it came.
"""

from __future__ import annotations

import json

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
BROKE_OFF = {"message": "The model server broke off this answer; send the request again.",
             "type": "server_error", "param": None, "code": "bad_gateway"}  # fmt: skip
CUT = f"data: {json.dumps({'error': BROKE_OFF})}\n\ndata: [DONE]\n\n"  # ends a stream broken off

SCRIPT = f"""\
-- vllm-compose's front door, on a streamed answer: the tokens of its last event's `usage`, and a
-- clean end when the model server breaks it off.
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

-- The question lengthens the request's body: it is sent chunked. The door's rules set its
-- headers so, which is what HAProxy 2.6 sends it by; 3.0 sends it by the message's own state,
-- which only set_body_len changes (2.6 has none): without it 3.0 sends no body at all.
local function chunked(msg)
  if msg.set_body_len then
    msg:set_body_len("chunked")
  end
end

-- The door's rules have run: it asks for the usage when they say so. Every streamed answer is
-- read, its usage only when there is one to read.
function Usage:http_headers(txn, msg)
  if msg.channel:is_resp() then
    local kind = txn.f:res_hdr("content-type") or ""
    if kind:find("text/event-stream", 1, true) then
      self.reading = self.asking or said(txn, "{ASKED}")
      filter.register_data_filter(self, msg.channel)
    end
  elseif said(txn, "{ASK}") then
    self.asking = true
    chunked(msg)
    filter.register_data_filter(self, msg.channel)
  end
end

-- The request's side is done: from now on an answer that can take no more was broken off.
function Usage:end_analyze(txn, chn)
  if not chn:is_resp() then
    self.requested = true
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

-- The usage, read from the whole events in `text` (the part of one kept from before, `tail`, then
-- the answer's input), and its event taken out when the door asked for it and it came whole.
-- Returns where the last whole event ends in `text`, and how many bytes were taken out.
local function read_usage(self, txn, msg, text, tail)
  local removed, last = 0, 1
  for first, event, after in text:gmatch("()data: ([^\\n]*)\\n\\n()") do
    if event:find('"usage"', 1, true) then
      local prompt = txn.c:json_query(event, "$.usage.{USAGE[PROMPT]}")
      local generated = txn.c:json_query(event, "$.usage.{USAGE[GENERATED]}")
      if prompt and generated then
        txn:set_var("{PROMPT}", prompt)
        txn:set_var("{GENERATED}", generated)
        if self.asking and first > #tail and event:find('"choices":%s*%[%s*%]') then
          msg:remove(first - 1 - #tail - removed, after - first)  -- the client did not ask
          removed = removed + after - first
        end
      end
    end
    last = after
  end
  return last, removed
end

-- The model server closed in the middle of the answer (the request's side is done and the
-- answer can take no more): a part held from `upto` on is dropped, and the answer ends with an
-- error event and [DONE], as a whole one ends (after a blank line, to end a part that went on).
-- Returns whether it did.
local function ended(self, msg, upto, under_way)
  if not (self.requested and not msg:eom() and not msg.channel:may_recv()) then
    return false
  end
  if msg:input() > upto then
    msg:remove(upto, msg:input() - upto)
  end
  msg:append((under_way and "\\n\\n" or "") .. [==[{CUT}]==])
  msg:set_eom()
  msg:forward(msg:input())
  return true
end

-- A stream with no usage to read goes on as it comes; only whether a part of an event went on
-- last is noted, for a clean end.
local function pass(self, msg)
  local input = msg:input()
  if input > 0 then
    self.under_way = msg:body(input - 2, 2) ~= "\\n\\n"
  end
  if not ended(self, msg, input, self.under_way) then
    msg:forward(input)
  end
end

-- A stream with a usage to read: whole events go on as they come. A part of one goes on too,
-- and is kept here to be read whole with its rest (up to 64 KiB), but where the door asked for
-- the usage: it waits in the buffer for its rest, so that the usage event can be taken out
-- whole. (Only there: a filter that holds a part back stalls HAProxy 3.0's answer when the
-- server sent it as one chunk larger than the buffer; vLLM sends each event as a chunk.)
local function read(self, txn, msg)
  local tail = self.tail or ""
  local text = tail .. (msg:body() or "")
  local last, removed = read_usage(self, txn, msg, text, tail)
  local upto, under_way = msg:input(), last <= #text
  self.tail = ""
  if under_way and self.asking and last > #tail and #text - last < 65536 then
    upto, under_way = last - 1 - #tail - removed, false  -- read again with its rest
  elseif under_way then
    self.tail = text:sub(last, last + 65535)
  end
  if not ended(self, msg, upto, under_way) then
    msg:forward(msg:eom() and msg:input() or upto)
  end
end

local function answer(self, txn, msg)
  if self.reading then
    read(self, txn, msg)
  else
    pass(self, msg)
  end
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
