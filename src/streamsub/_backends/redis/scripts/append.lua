-- Append a batch of messages to one partition's stream, in order.
-- KEYS[1]: the stream. ARGV[1]: the batch, packed: per message a big-endian
-- uint16 value count n, then n values (field, value, field, value, ...), each
-- a big-endian uint32 length and its bytes; or a value count of 0, then a run
-- of messages that are data alone: a big-endian uint32 message count, each
-- message's data length as a big-endian uint32, then their data one after the
-- other (field 'd'; a sixth less of Redis's time a message than the general
-- form, and the client packs the lengths and the data each in one step).
-- Returns the new entry ids in one string, separated by spaces.
-- One argument instead of thousands: packing arguments one by one, not Redis,
-- is what limits a Python publisher; and one reply, which the client splits at
-- once, instead of one per message.
-- Linked writes (a publisher with writes in flight): KEYS[2] is the writer's
-- link on this partition (it shares the stream's tag), ARGV[2] this write's
-- number, ARGV[3] the number of the write that must have been stored first,
-- or '' for none. A write whose link does not hold stores nothing and answers
-- BROKENLINK: an earlier write of the writer failed, and this one must not
-- overtake it.
-- Wake-ups (Redis Cluster on 7.0+ only): ARGV[4], when given and not '', is the
-- partition's wake-up channel (it shares the stream's tag, so it is in this
-- script's slot), to which an empty message is SPUBLISHed after the entries
-- are added: idle readers of the partition poll at once (_wakeups.py). ARGV[2]
-- and ARGV[3] are '' then for an unlinked write. pcall: a server without
-- SPUBLISH (6.2) must not fail a write whose entries are stored already; a
-- refused SPUBLISH (that, or a user not allowed the channel) adds '!' as the
-- reply's last word, and the client stops sending the channel.
local key, blob = KEYS[1], ARGV[1]
-- Topics create their streams; a missing one means the topic was deleted.
if redis.call('EXISTS', key) == 0 then
  return redis.error_reply('NOTOPIC stream ' .. key .. ' does not exist')
end
local link = KEYS[2]
if link and ARGV[3] ~= '' and redis.call('GET', link) ~= ARGV[3] then
  return redis.error_reply('BROKENLINK write ' .. ARGV[2] .. ' of ' .. link ..
    ' follows write ' .. ARGV[3] .. ', which was not stored')
end
local struct_unpack, call, sub = struct.unpack, redis.call, string.sub
-- Per value count, the format that reads all of a message's values at once:
-- 'c0' is a string as long as the integer read before it.
local formats = {}
local ids, count = {}, 0
local pos, last = 1, #blob
while pos <= last do
  local n
  n, pos = struct_unpack('>I2', blob, pos)
  if n == 0 then
    local run
    run, pos = struct_unpack('>I4', blob, pos)
    local at = pos + 4 * run  -- the first message's data, behind the lengths
    for _ = 1, run do
      local size
      size, pos = struct_unpack('>I4', blob, pos)
      -- As struct.unpack's 'c0' did: a length past the batch's end is an error.
      assert(at + size - 1 <= last, 'a run whose lengths pass the end of the batch')
      count = count + 1
      ids[count] = call('XADD', key, '*', 'd', sub(blob, at, at + size - 1))
      at = at + size
    end
    pos = at
  else
    local format = formats[n]
    if not format then
      format = '>' .. string.rep('I4c0', n)
      formats[n] = format
    end
    local values = {struct_unpack(format, blob, pos)}
    pos = values[n + 1]
    count = count + 1
    ids[count] = call('XADD', key, '*', unpack(values, 1, n))
  end
end
if link then
  -- Only writes in flight behind this one read it: a minute outlives them.
  redis.call('SET', link, ARGV[2], 'PX', 60000)
end
local wake = ARGV[4]
if wake and wake ~= '' then
  local sent = redis.pcall('SPUBLISH', wake, '')
  if type(sent) == 'table' and sent.err then
    ids[count + 1] = '!'
  end
end
return table.concat(ids, ' ')
