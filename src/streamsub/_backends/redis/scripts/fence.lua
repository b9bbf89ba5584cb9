-- A new owner of an ordered subscription's partition raises the partition's
-- fence to its fencing token before it takes anything over there; reads of
-- the partition (read_owned.lua) then serve only the holder of that token. The
-- fence lives in the partition's slot (the ownership records do not), so the
-- check and the read are one atomic step on the partition's node.
-- KEYS[1]: the fence. ARGV[1]: the token.
-- Returns 1 if the fence holds the token now, 0 if it holds a larger one (a
-- newer owner's: this one is stale and must not read the partition).
local token = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if token < current then
  return 0
end
if token > current then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
