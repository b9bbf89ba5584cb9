-- Move one entry to the dead-letter topic and acknowledge it, in one step, but
-- only while this consumer still owns it: a retried call, two subscribers
-- sweeping the same exhausted entry or a lease lost meanwhile write nothing.
-- KEYS[1]: the source stream, KEYS[2]: the dead-letter stream, KEYS[3]: the
-- source's delivery-time records, KEYS[4]: its delay set.
-- ARGV: group, consumer, id, first delivery ms ("" = from the records), last
-- delivery ms ("" = from the records), the message packed as append.lua takes
-- it (without the delivery times, which this script adds).
-- Returns the dead-letter entry id, or false when the entry was not this
-- consumer's to move (already moved, acknowledged or taken by another).
-- Redis Cluster keeps the two streams in different slots; the cluster backend
-- appends first and acknowledges after, so a crash between can duplicate a
-- dead letter but never lose one.
local source, target, times, delays = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer, id = ARGV[1], ARGV[2], ARGV[3]
local first, last, blob = ARGV[4], ARGV[5], ARGV[6]
-- Topics create their streams; a missing one means the dead-letter topic was
-- deleted: writing would recreate a bare stream nobody reads.
if redis.call('EXISTS', target) == 0 then
  return redis.error_reply('NOTOPIC dead-letter stream ' .. target .. ' does not exist')
end
local pending = redis.call('XPENDING', source, group, id, id, 1)
if not (pending[1] and pending[1][2] == consumer) then
  return false
end
local record = redis.call('HGET', times, id)
if record then
  local sep = string.find(record, ':', 1, true)
  if first == '' then first = string.sub(record, 1, sep - 1) end
  if last == '' then last = string.sub(record, sep + 1) end
end
local clock = redis.call('TIME')
local now = tostring(tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000))
if last == '' then last = now end
if first == '' then first = last end
local new_id = append_dead_letter(target, blob, first, last)
redis.call('XACK', source, group, id)
redis.call('HDEL', times, id)
redis.call('ZREM', delays, id)
return new_id
