-- dead_letter.lua in three steps, for Redis Cluster, where the dead-letter
-- stream is in another slot than the source: "check" that this consumer owns
-- the entry and read its delivery times, "append" the dead letter, then "ack"
-- the source only while this consumer still owns it. A crash (or a lost lease)
-- between append and ack can duplicate a dead letter, never lose one.
-- check: KEYS[1]: the source stream, KEYS[2]: its delivery-time records.
--   ARGV: "check", group, consumer, id. Returns {first ms, last ms}, or false
--   when the entry is not this consumer's.
-- append: KEYS[1]: the dead-letter stream. ARGV: "append", first ms, last ms,
--   the message packed as append.lua takes it, and optionally the target's
--   wake-up channel (see append.lua). Returns the new entry id.
-- ack: KEYS[1]: the source stream, KEYS[2]: its records, KEYS[3]: its delay set.
--   ARGV: "ack", group, consumer, id. Returns 1 when acknowledged.
local step = ARGV[1]
if step == 'check' then
  local source, times, group, consumer, id = KEYS[1], KEYS[2], ARGV[2], ARGV[3], ARGV[4]
  local pending = redis.call('XPENDING', source, group, id, id, 1)
  if not (pending[1] and pending[1][2] == consumer) then
    return false
  end
  local first, last = '', ''
  local record = redis.call('HGET', times, id)
  if record then
    local sep = string.find(record, ':', 1, true)
    first, last = string.sub(record, 1, sep - 1), string.sub(record, sep + 1)
  end
  if last == '' then
    local clock = redis.call('TIME')
    last = tostring(tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000))
  end
  if first == '' then first = last end
  return {first, last}
elseif step == 'append' then
  local target, first, last, blob, wake = KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
  if redis.call('EXISTS', target) == 0 then
    return redis.error_reply('NOTOPIC dead-letter stream ' .. target .. ' does not exist')
  end
  return append_dead_letter(target, blob, first, last, wake)
elseif step == 'ack' then
  local source, times, delays = KEYS[1], KEYS[2], KEYS[3]
  local group, consumer, id = ARGV[2], ARGV[3], ARGV[4]
  local pending = redis.call('XPENDING', source, group, id, id, 1)
  if not (pending[1] and pending[1][2] == consumer) then
    return 0
  end
  redis.call('XACK', source, group, id)
  redis.call('HDEL', times, id)
  redis.call('ZREM', delays, id)
  return 1
end
return redis.error_reply('dead_letter_steps.lua: unknown step ' .. tostring(step))
