-- Partition ownership of an ordered subscription: one heartbeat of one member.
--
-- Members are a sorted set (member -> expiry, server ms). The owners hash holds,
-- per partition, "<owner> <fencing token> <expiry ms>" and, under "t<p>", the
-- last token handed out for p: each new owner of p gets a larger token.
--
-- Which member a partition belongs to by right is sticky, as Kafka's
-- cooperative-sticky assignor: with n live members each is due floor(P/n)
-- partitions, or one more (the members owning most get the extras, ties by
-- name). A live owner keeps its partitions up to what it is due (the lowest
-- first); every other partition (free, its owner gone, or beyond its owner's
-- due) goes to the members below their due, round robin by name. So a join
-- moves only the newcomer's share and a leave or crash only the leaver's, and
-- every member computes the same rights from the same state.
--
-- A member keeps (and extends) the partitions it owns until it releases them,
-- also those that by right are another's now: it stops reading those, lets
-- their messages finish, then releases them (cooperative hand-over). A member
-- takes a partition that is its by right once the partition is free: released,
-- never owned, or its owner's lease expired (crashed).
--
-- Two subscribers may use one member name (a restart, or a mistake): the
-- owners hash records under "i:<member>" the instance that holds the name. An
-- instance's first heartbeat claims the name, and what the name owns passes to
-- it under new fencing tokens (as Kafka's static members fence the old one);
-- any other instance's heartbeat is answered "fenced" and does nothing.
--
-- KEYS[1]: members, KEYS[2]: owners.
-- ARGV[1]: member, ARGV[2]: lease (ms), ARGV[3]: partitions, ARGV[4]: "1" to
-- leave (release everything, stop being a member), ARGV[5]: "1" to take free
-- partitions that are the member's by right ("0" while it stops: it keeps and
-- renews what it owns, takes nothing new), ARGV[6]: "1" to claim the name,
-- ARGV[7]: the instance ('' for none: no check), ARGV[8]: "1" to create the
-- records if they are missing, ARGV[9..]: partitions to release.
-- Returns {{p, token, ...} owned, {p, ...} to hand back, members, waiting,
-- fenced, gone}: "waiting" counts the partitions that are this member's by
-- right but still held by another live owner; "gone" (1) says the records are
-- missing and ARGV[8] was not "1": nothing was written. The owners hash lives
-- as long as the subscription ("v" marks it), so a member of a subscription
-- deleted meanwhile (its records deleted with it) writes nothing back.
redis.replicate_commands()
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local me, lease, count = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local leaving, taking = ARGV[4] == '1', ARGV[5] == '1'
local claiming, instance = ARGV[6] == '1', ARGV[7]
if redis.call('EXISTS', KEYS[2]) == 0 then
  if ARGV[8] ~= '1' then
    return {{}, {}, 0, 0, 0, 1}
  end
  redis.call('HSET', KEYS[2], 'v', '1')
end
-- A new fencing token for partition p: larger than any handed out before, and
-- at least the server clock (ms), so that tokens keep growing even where this
-- hash lost its last writes (a failover to a replica that was behind): the
-- fences in the partitions' own slots (fence.lua) hold the tokens last used.
local function new_token(p)
  local token = redis.call('HINCRBY', KEYS[2], 't' .. p, 1)
  if token < now then
    token = now
    redis.call('HSET', KEYS[2], 't' .. p, string.format('%d', now))
  end
  return string.format('%d', token)
end

local release = {}
for i = 9, #ARGV do
  release[tonumber(ARGV[i])] = true
end

if instance ~= '' then
  local holder = redis.call('HGET', KEYS[2], 'i:' .. me)
  if holder and holder ~= instance and not claiming then
    return {{}, {}, redis.call('ZCARD', KEYS[1]), 0, 1, 0}
  end
  if holder ~= instance then
    redis.call('HSET', KEYS[2], 'i:' .. me, instance)
    for p = 0, count - 1 do
      local value = redis.call('HGET', KEYS[2], p)
      if value then
        local owner, _, expiry = string.match(value, '^(.*) (%d+) (%d+)$')
        if owner == me then
          redis.call('HSET', KEYS[2], p, me .. ' ' .. new_token(p) .. ' ' .. expiry)
        end
      end
    end
  end
end

-- Members gone (their leases ended) take their name records with them.
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  if gone ~= me then
    redis.call('HDEL', KEYS[2], 'i:' .. gone)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if leaving then
  redis.call('ZREM', KEYS[1], me)
  redis.call('HDEL', KEYS[2], 'i:' .. me)
else
  redis.call('ZADD', KEYS[1], now + lease, me)
end
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(members)
local n = #members
local is_member = {}
for _, m in ipairs(members) do
  is_member[m] = true
end

-- Current owners, and how many live ones each member has.
local fields = {}
for p = 0, count - 1 do
  fields[p + 1] = p
end
local values = redis.call('HMGET', KEYS[2], unpack(fields))
local current, counts = {}, {}
for p = 0, count - 1 do
  local value = values[p + 1]
  if value then
    local owner, token, expiry = string.match(value, '^(.*) (%d+) (%d+)$')
    expiry = tonumber(expiry)
    current[p] = {owner, token, expiry}
    if is_member[owner] and expiry >= now then
      counts[owner] = (counts[owner] or 0) + 1
    end
  end
end

-- Rights (see above).
local rights, due, kept = {}, {}, {}
if n > 0 then
  local by_load = {}
  for i, m in ipairs(members) do
    by_load[i] = m
    kept[m] = 0
  end
  table.sort(by_load, function(a, b)
    local ca, cb = counts[a] or 0, counts[b] or 0
    if ca ~= cb then
      return ca > cb
    end
    return a < b
  end)
  local base, extra = math.floor(count / n), count % n
  for i, m in ipairs(by_load) do
    due[m] = base + ((i <= extra) and 1 or 0)
  end
  for p = 0, count - 1 do
    local c = current[p]
    if c and is_member[c[1]] and c[3] >= now and kept[c[1]] < due[c[1]] then
      rights[p] = c[1]
      kept[c[1]] = kept[c[1]] + 1
    end
  end
  local turn = 0
  for p = 0, count - 1 do
    if not rights[p] then
      for _ = 1, n do
        turn = turn % n + 1
        local m = members[turn]
        if kept[m] < due[m] then
          rights[p] = m
          kept[m] = kept[m] + 1
          break
        end
      end
    end
  end
end

local owned, give, waiting = {}, {}, 0
for p = 0, count - 1 do
  local rightful = rights[p]
  local owner, token, expiry = nil, nil, 0
  if current[p] then
    owner, token, expiry = current[p][1], current[p][2], current[p][3]
  end
  if owner == me then
    if leaving or release[p] then
      redis.call('HDEL', KEYS[2], p)
    else
      redis.call('HSET', KEYS[2], p, me .. ' ' .. token .. ' ' .. (now + lease))
      owned[#owned + 1] = p
      owned[#owned + 1] = token
      if rightful ~= me then
        give[#give + 1] = p
      end
    end
  elseif rightful == me and not leaving then
    if (owner == nil or expiry < now) and taking then
      local new = new_token(p)
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
return {owned, give, #members, waiting, 0, 0}
