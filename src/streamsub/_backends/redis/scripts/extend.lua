-- Extend the leases of entries this consumer still owns: reset their idle time
-- without counting a delivery. An entry another consumer has claimed meanwhile
-- is left alone (XCLAIM with min-idle 0 would steal it back).
-- KEYS[1]: the stream. ARGV: group, consumer, id, id, ...
-- Returns the ids that are still this consumer's.
-- The XCLAIM arguments are built as one table and unpacked whole: Lua cuts an
-- unpack() in the middle of an argument list to its first value.
local key, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local owned = {}
for i = 3, #ARGV do
  local pending = redis.call('XPENDING', key, group, ARGV[i], ARGV[i], 1)
  if pending[1] and pending[1][2] == consumer then
    owned[#owned + 1] = ARGV[i]
  end
end
for first = 1, #owned, 500 do
  local args = {'XCLAIM', key, group, consumer, 0}
  for i = first, math.min(first + 499, #owned) do args[#args + 1] = owned[i] end
  args[#args + 1] = 'IDLE'
  args[#args + 1] = 0
  args[#args + 1] = 'JUSTID'
  redis.call(unpack(args))
end
return owned
