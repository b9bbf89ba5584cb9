-- Append a batch of messages to one partition's stream, in order.
-- KEYS[1]: the stream. ARGV: for each message, its field count n, then n
-- values (field, value, field, value, ...). Returns the new entry ids.
-- One call replaces a pipeline of XADDs: the client's per-command cost, not
-- Redis, is what limits a Python publisher.
local key = KEYS[1]
local ids = {}
local i = 1
local last = #ARGV
while i <= last do
  local n = tonumber(ARGV[i])
  ids[#ids + 1] = redis.call('XADD', key, '*', unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
return ids
