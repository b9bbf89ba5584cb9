-- Give back entries this consumer still holds in the delivery named, each
-- after its own delay, and record when it was delivered (for dead letters).
-- KEYS[1]: the stream, KEYS[2]: the delay set, KEYS[3]: delivery-time records.
-- ARGV: group, consumer, min-idle ms of the reclaimers (the ack deadline),
-- then for each entry: id, delay ms, delivery time ms, delivery count of the
-- delivery being given back, handled (1, or 0 when no handler saw it: read but
-- given back at shutdown).
-- An entry is touched only while this consumer owns it with that delivery
-- count: a late nack of an older delivery never moves a newer one.
-- A delay up to min-idle sets the idle time to (min-idle - delay), so that a
-- reclaimer takes the entry after the delay. A longer one goes in the delay set
-- and is parked under the consumer 'streamsub.delayed', which reclaimers' scans
-- pass over by name: waiting entries cost no lookup; the due ones are read
-- from the delay set (ZRANGEBYSCORE up to now).
-- An entry no handler saw gets its delivery count back, so the reclaim that
-- delivers it counts the same attempt again.
-- Returns the ids that were given back.
local key, delays, times = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, min_idle = ARGV[1], ARGV[2], tonumber(ARGV[3])
local PARKED = 'streamsub.delayed'
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local given = {}
for i = 4, #ARGV, 5 do
  local id, delay, delivered_at = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local attempt, handled = tonumber(ARGV[i + 3]), ARGV[i + 4]
  local pending = redis.call('XPENDING', key, group, id, id, 1)
  if pending[1] and pending[1][2] == consumer and pending[1][4] == attempt then
    local idle, owner = 0, consumer
    if delay <= min_idle then
      idle = min_idle - delay
      redis.call('ZREM', delays, id)
    else
      redis.call('ZADD', delays, now + delay, id)
      owner = PARKED
    end
    if handled == '1' then
      local record = redis.call('HGET', times, id)
      local first = delivered_at
      if record then
        first = string.sub(record, 1, string.find(record, ':', 1, true) - 1)
      end
      redis.call('HSET', times, id, first .. ':' .. delivered_at)
      redis.call('XCLAIM', key, group, owner, 0, id, 'IDLE', idle, 'JUSTID')
    else
      redis.call('XCLAIM', key, group, owner, 0, id, 'IDLE', idle,
        'RETRYCOUNT', math.max(0, attempt - 1), 'JUSTID')
    end
    given[#given + 1] = id
  end
end
return given
