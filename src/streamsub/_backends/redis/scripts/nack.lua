-- Give back entries this consumer still owns, each after its own delay, and
-- record when it was delivered (for the dead-letter metadata).
-- KEYS[1]: the stream, KEYS[2]: the delay set, KEYS[3]: delivery-time records.
-- ARGV: group, consumer, min-idle ms of the reclaimers (the ack deadline),
-- then for each entry: id, delay ms, delivery time ms.
-- A delay up to min-idle sets the idle time to (min-idle - delay), so that a
-- reclaimer takes the entry after the delay; a longer one goes in the delay set.
-- Returns the ids that were still this consumer's.
local key, delays, times = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, min_idle = ARGV[1], ARGV[2], tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local owned = {}
for i = 4, #ARGV, 3 do
  local id, delay, delivered_at = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local pending = redis.call('XPENDING', key, group, id, id, 1)
  if pending[1] and pending[1][2] == consumer then
    local record = redis.call('HGET', times, id)
    local first = delivered_at
    if record then
      first = string.sub(record, 1, string.find(record, ':', 1, true) - 1)
    end
    redis.call('HSET', times, id, first .. ':' .. delivered_at)
    if delay <= min_idle then
      redis.call('XCLAIM', key, group, consumer, 0, id, 'IDLE', min_idle - delay, 'JUSTID')
    else
      redis.call('ZADD', delays, now + delay, id)
      redis.call('XCLAIM', key, group, consumer, 0, id, 'IDLE', 0, 'JUSTID')
    end
    owned[#owned + 1] = id
  end
end
return owned
