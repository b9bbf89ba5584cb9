-- Partition ownership of an ordered subscription: one heartbeat of one member.
--
-- Members are a sorted set (member -> expiry, server ms). Partition p belongs by
-- right to the p-th live member, round robin over the members sorted by name,
-- so every member computes the same assignment. The owners hash holds, per
-- partition, "<owner> <fencing token> <expiry ms>" and, under "t<p>", the last
-- token handed out for p: each new owner of p gets a larger token.
--
-- A member keeps (and extends) the partitions it owns until it releases them,
-- also those that by right are another's now: it stops reading those, lets
-- their messages finish, then releases them (cooperative hand-over). A member
-- takes a partition that is its by right once the partition is free: released,
-- never owned, or its owner's lease expired (crashed).
--
-- KEYS[1]: members, KEYS[2]: owners.
-- ARGV[1]: member, ARGV[2]: lease (ms), ARGV[3]: partitions, ARGV[4]: "1" to
-- leave (release everything, stop being a member), ARGV[5]: "1" to take free
-- partitions that are the member's by right ("0" while it stops: it keeps and
-- renews what it owns, takes nothing new), ARGV[6..]: partitions to release.
-- Returns {{p, token, ...} owned, {p, ...} to hand back, members, waiting}:
-- "waiting" counts the partitions that are this member's by right but still
-- held by another live owner.
redis.replicate_commands()
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local me, lease, count = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local leaving, taking = ARGV[4] == '1', ARGV[5] == '1'
local release = {}
for i = 6, #ARGV do
  release[tonumber(ARGV[i])] = true
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if leaving then
  redis.call('ZREM', KEYS[1], me)
else
  redis.call('ZADD', KEYS[1], now + lease, me)
end
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(members)

local owned, give, waiting = {}, {}, 0
for p = 0, count - 1 do
  local rightful = nil
  if #members > 0 then
    rightful = members[(p % #members) + 1]
  end
  local owner, token, expiry = nil, nil, 0
  local current = redis.call('HGET', KEYS[2], p)
  if current then
    owner, token, expiry = string.match(current, '^(.*) (%d+) (%d+)$')
    expiry = tonumber(expiry)
  end
  if owner == me then
    if leaving or release[p] then
      redis.call('HDEL', KEYS[2], p)
    else
      redis.call('HSET', KEYS[2], p, me .. ' ' .. token .. ' ' .. (now + lease))
      owned[#owned + 1] = p
      owned[#owned + 1] = tonumber(token)
      if rightful ~= me then
        give[#give + 1] = p
      end
    end
  elseif rightful == me and not leaving then
    if (owner == nil or expiry < now) and taking then
      local new = redis.call('HINCRBY', KEYS[2], 't' .. p, 1)
      redis.call('HSET', KEYS[2], p, me .. ' ' .. new .. ' ' .. (now + lease))
      owned[#owned + 1] = p
      owned[#owned + 1] = new
    else
      waiting = waiting + 1
    end
  end
end
-- The owners hash stays (its token counters must only grow); deleting the
-- subscription deletes it.
redis.call('PEXPIRE', KEYS[1], lease * 10)
return {owned, give, #members, waiting}
