-- Stream entry ids as text, prepended to the scripts that compare them.
-- Compared as text (milliseconds, then sequence, each a decimal number
-- compared by length, then digit by digit): tonumber loses precision above
-- 2^53, and a sequence can be 2^64 - 1 (where a seek to a time leaves a group).
local MAX_SEQ = '18446744073709551615'
local function split(id)
  local dash = string.find(id, '-', 1, true)
  if dash == nil then return id, '0' end
  return string.sub(id, 1, dash - 1), string.sub(id, dash + 1)
end
local function digits_less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function less(a, b)
  local am, as = split(a)
  local bm, bs = split(b)
  if am ~= bm then return digits_less(am, bm) end
  return digits_less(as, bs)
end
local function plus_one(digits)
  local head, nines = string.match(digits, '^(.-)(9*)$')
  local zeros = string.rep('0', #nines)
  if head == '' then return '1' .. zeros end
  local last = string.byte(head, #head) - 47
  return string.sub(head, 1, #head - 1) .. string.char(48 + last) .. zeros
end
local function successor(id)
  local ms, seq = split(id)
  if seq == MAX_SEQ then return plus_one(ms) .. '-0' end
  return ms .. '-' .. plus_one(seq)
end
local function lower(a, b)
  if a == nil then return b end
  if b == nil or less(a, b) then return a end
  return b
end
