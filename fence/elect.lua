-- Elections (put at the top of an election's scripts, after the line
-- that sets publish, before the script and queue.lua's parts). An election is the lock of its name: its terms
-- are the lock's holdings, its candidates the lock's queue. What a lock
-- lacks is kept here: the leader's value, a record of the last term that
-- outlives it, and a channel that tells observers of every change.
--
-- The lines of queue.lua, acquire.lua, release.lua and leave.lua that start
-- with "--elect " call these functions: they are comments in a lock's
-- scripts and code in an election's (scripts.go drops the marker), so a
-- plain lock pays nothing for elections.
--
-- KEYS[5] the record of the last term, a string
--   '<state><how>:<token>:<seq>:<prev>:<lease>:<holder length>:<holder><value>':
--   state L while the term leads (its lock may have expired since: nothing
--   runs at an expiry) or R once it resigned with no successor; prev the
--   token of the term before it ('0' when none is known) and how that term
--   ended: H handed over to this one, R resigned, E expired (its record
--   still said L when this term began), '-' unknown; seq counts the
--   record's changes within the term (a proclaim, the resignation), so that
--   (token, seq) orders every record of a name; lease the term's lease in
--   ms when it began (an observer reads the lock again when it would have
--   expired: nothing is published at an expiry). It expires 30 days after
--   its last change, as the counter does.
-- KEYS[6] the candidates' values: a hash, holder id -> value, written when
--   a candidate joins the queue and read when the lock is handed to it; it
--   expires with the queue.
-- KEYS[1]..':ev' the channel of the records: every change of the record is
--   published there, whole, so that an observer needs no read.

local record_ttl = '2592000000' -- ms: 30 days, as queue.lua's counter_ttl
-- handing is the value of the term that a release is handing over (set by
-- pass_on before it grants the lock), nil otherwise.
local handing

local function token_of(v)
  return string.match(v, '^(%d+):')
end

-- put stores record r and publishes it (a refused PUBLISH is ignored:
-- observers then learn of the change at their next read).
local function put(r)
  redis.call('SET', KEYS[5], r, 'PX', record_ttl)
  redis.pcall(publish, KEYS[1] .. ':ev', r)
end

-- parse splits a record: state, how, token, seq, prev, holder, value.
-- parse splits a record: state, how, token, seq, prev, lease, holder, value.
local function parse(r)
  local st, how, t, seq, prev, lease, n, at = string.match(r, '^(%u)(.):(%d+):(%d+):(%d+):(%d+):(%d+):()')
  if not at then
    return nil
  end
  local holder = string.sub(r, at, at + n - 1)
  return st, how, t, tonumber(seq), prev, lease, holder, string.sub(r, at + n)
end

local function format(st, how, t, seq, prev, lease, holder, value)
  return st .. how .. ':' .. t .. ':' .. seq .. ':' .. prev .. ':' .. lease .. ':' .. #holder .. ':' .. holder .. value
end

-- began records that the lock's value v ('<token>:<holder>') is a new term
-- of holder id with a lease of lease ms, whose value is value, or the one
-- it left when it joined the queue (nil value).
local function began(v, id, lease, value)
  local t = token_of(v)
  local cv = redis.call('HGET', KEYS[6], id)
  if cv then
    redis.call('HDEL', KEYS[6], id)
  end
  value = value or cv or ''
  local prev, how = '0', '-'
  if handing then
    prev, how = token_of(handing), 'H'
  else
    local old = redis.call('GET', KEYS[5])
    if old then
      local st, _, ot = parse(old)
      if ot and ot ~= t then
        prev, how = ot, (st == 'L' and 'E' or 'R')
      end
    end
  end
  put(format('L', how, t, 0, prev, lease, id, value))
end

-- resigned records that the term v ended with no successor.
local function resigned(v)
  local old = redis.call('GET', KEYS[5])
  if not old then
    return
  end
  local st, how, t, seq, prev, lease, holder, value = parse(old)
  if st == 'L' and t == token_of(v) then
    put(format('R', how, t, seq + 1, prev, lease, holder, value))
  end
end

-- proclaim makes value the value of term v (which the caller checked is
-- the lock's), publishing the change; a term without a record of its own
-- (its record was lost, or a plain Acquire made it) gets one.
local function proclaim(v, value)
  local t = token_of(v)
  local old = redis.call('GET', KEYS[5])
  if old then
    local st, how, ot, seq, prev, lease, holder, cur = parse(old)
    if st == 'L' and ot == t then
      if cur ~= value then
        put(format('L', how, t, seq + 1, prev, lease, holder, value))
      end
      return
    end
  end
  put(format('L', '-', t, 0, '0', redis.call('PTTL', KEYS[1]), string.sub(v, #t + 2), value))
end

-- candidate keeps the value of waiter id (given when it joins the queue)
-- for as long as its place in the queue lives.
local function candidate(id, value)
  if value then
    redis.call('HSET', KEYS[6], id, value)
  end
  local ttl = redis.call('PTTL', KEYS[4])
  if ttl > 0 then -- the queue has its expiry (q.keep sets it); never PEXPIRE to a past time, which deletes
    redis.call('PEXPIRE', KEYS[6], ttl)
  end
end
