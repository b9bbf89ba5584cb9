-- Extend the leases of entries this consumer still owns: reset their idle time
-- without counting a delivery. An entry another consumer has claimed meanwhile
-- is left alone (XCLAIM with min-idle 0 would steal it back).
-- KEYS[1]: the stream. ARGV: group, consumer, id, id, ...
-- Returns the ids that are still this consumer's.
local key, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local owned = {}
for i = 3, #ARGV do
  local pending = redis.call('XPENDING', key, group, ARGV[i], ARGV[i], 1)
  if pending[1] and pending[1][2] == consumer then
    owned[#owned + 1] = ARGV[i]
  end
end
if #owned > 0 then
  redis.call('XCLAIM', key, group, consumer, 0, unpack(owned), 'IDLE', 0, 'JUSTID')
end
return owned
