-- Delete entries from a stream and from every group's pending list, in one step
-- (so no subscription of the stream is left holding an id that is gone).
-- KEYS[1]: the stream, KEYS[2]: its replay claims (claim_entries.lua), which
-- the deleted ids leave too. ARGV: the entry ids. Returns how many entries existed.
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then return 0 end
for i = 1, #ARGV, 1000 do
  redis.call('HDEL', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
for _, raw in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  local name
  for i = 1, #raw, 2 do
    if raw[i] == 'name' then name = raw[i + 1] end
  end
  for i = 1, #ARGV, 1000 do
    redis.call('XACK', key, name, unpack(ARGV, i, math.min(i + 999, #ARGV)))
  end
end
local deleted = 0
for i = 1, #ARGV, 1000 do
  deleted = deleted + redis.call('XDEL', key, unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return deleted
