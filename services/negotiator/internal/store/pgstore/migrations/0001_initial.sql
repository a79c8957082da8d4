-- The negotiator's tables (schema "negotiator"). Names compare bytewise
-- (COLLATE "C") so that pages resume in the order bbolt keeps them.

-- ledger_entries: one row per LLM call, named ledgerEntries/{16 hex} from
-- ledger_seq, so names increase with time.
CREATE SEQUENCE ledger_seq;
CREATE TABLE ledger_entries (
  name  text COLLATE "C" PRIMARY KEY,
  agent text NOT NULL,
  role  text NOT NULL,
  data  bytea NOT NULL
);

-- totals: running sums of the ledger under keys chosen by the ledger package.
CREATE TABLE totals (
  key               text PRIMARY KEY,
  calls             bigint NOT NULL,
  prompt_tokens     bigint NOT NULL,
  completion_tokens bigint NOT NULL,
  cost_micro_usd    bigint NOT NULL
);

-- verdicts: cached SuitabilityVerdicts by cache key.
CREATE TABLE verdicts (name text PRIMARY KEY, data bytea NOT NULL);

-- negotiations: Negotiation by name negotiations/{id}.
CREATE TABLE negotiations (name text PRIMARY KEY, data bytea NOT NULL);

-- routine_candidates: RoutineCandidate by name routineCandidates/{id}.
CREATE TABLE routine_candidates (name text PRIMARY KEY, data bytea NOT NULL);
