-- Append a batch of messages to one partition's stream, in order.
-- KEYS[1]: the stream. ARGV[1]: the batch, packed: per message a big-endian
-- uint16 value count n, then n values (field, value, field, value, ...), each
-- a big-endian uint32 length and its bytes. Returns the new entry ids.
-- One argument instead of thousands: packing arguments one by one, not Redis,
-- is what limits a Python publisher.
local key, blob = KEYS[1], ARGV[1]
-- Topics create their streams; a missing one means the topic was deleted.
if redis.call('EXISTS', key) == 0 then
  return redis.error_reply('NOTOPIC stream ' .. key .. ' does not exist')
end
local unpack_uint, sub = struct.unpack, string.sub
local ids = {}
local pos, last = 1, #blob
while pos <= last do
  local n
  n, pos = unpack_uint('>I2', blob, pos)
  local args = {}
  for j = 1, n do
    local len
    len, pos = unpack_uint('>I4', blob, pos)
    args[j] = sub(blob, pos, pos + len - 1)
    pos = pos + len
  end
  ids[#ids + 1] = redis.call('XADD', key, '*', unpack(args))
end
return ids
