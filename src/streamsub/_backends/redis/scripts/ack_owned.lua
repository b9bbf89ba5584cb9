-- Acknowledge entries only where this consumer still owns them (exactly-once
-- delivery's ack_with_response). KEYS[1]: the stream, KEYS[2]: delivery-time
-- records. ARGV: group, consumer, id, id, ...
-- Returns the ids acknowledged; the others' leases were lost.
local key, times, group, consumer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local acked = {}
for i = 3, #ARGV do
  local pending = redis.call('XPENDING', key, group, ARGV[i], ARGV[i], 1)
  if pending[1] and pending[1][2] == consumer then
    redis.call('XACK', key, group, ARGV[i])
    redis.call('HDEL', times, ARGV[i])
    acked[#acked + 1] = ARGV[i]
  end
end
return acked
