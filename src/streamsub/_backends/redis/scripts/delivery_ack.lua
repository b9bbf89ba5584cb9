-- Acknowledge deliveries named by their ack ids (the Pub/Sub gateway): an entry
-- is acknowledged only while the pending list still shows the consumer it was
-- delivered to and the delivery count it was delivered with, so an ack from a
-- delivery whose lease lapsed and went to someone else settles nothing.
-- KEYS[1]: the stream, KEYS[2]: delivery-time records.
-- ARGV: group, then for each delivery: id, consumer, delivery count.
-- Returns the ids acknowledged.
local key, times, group = KEYS[1], KEYS[2], ARGV[1]
local acked = {}
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', key, group, id, id, 1)
  if pending[1] and pending[1][2] == ARGV[i + 1] and pending[1][4] == tonumber(ARGV[i + 2]) then
    redis.call('XACK', key, group, id)
    redis.call('HDEL', times, id)
    acked[#acked + 1] = id
  end
end
return acked
