-- Acknowledge entries only where this consumer still owns them in the delivery
-- named (exactly-once delivery's ack_with_response).
-- KEYS[1]: the stream, KEYS[2]: delivery-time records.
-- ARGV: group, consumer, then id, delivery count, id, delivery count, ...
-- Returns the ids acknowledged; the others' leases were lost.
local key, times, group, consumer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local acked = {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', key, group, id, id, 1)
  if pending[1] and pending[1][2] == consumer and pending[1][4] == tonumber(ARGV[i + 1]) then
    redis.call('XACK', key, group, id)
    redis.call('HDEL', times, id)
    acked[#acked + 1] = id
  end
end
return acked
