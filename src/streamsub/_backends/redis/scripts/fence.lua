-- A new owner of an ordered subscription's partition raises the partition's
-- fence to its fencing token before it takes anything over there; reads of
-- the partition (read_owned.lua) then serve only the holder of that token. The
-- fence lives in the partition's slot (the ownership records do not), so the
-- check and the read are one atomic step on the partition's node.
-- KEYS[1]: the fence, KEYS[2]: the partition's stream. ARGV[1]: the token,
-- ARGV[2]: the subscription (its consumer group).
-- Returns 1 if the fence holds the token now, 0 if it holds a larger one (a
-- newer owner's: this one is stale and must not read the partition), a NOGROUP
-- error if the subscription's group is gone (deleted meanwhile: no fence is
-- left behind for it).
local found = false
if redis.call('EXISTS', KEYS[2]) == 1 then
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    if group[2] == ARGV[2] then
      found = true
      break
    end
  end
end
if not found then
  return redis.error_reply('NOGROUP no consumer group ' .. ARGV[2] .. ' on ' .. KEYS[2])
end
local token = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if token < current then
  return 0
end
if token > current then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
