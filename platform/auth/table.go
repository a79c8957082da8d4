package auth

// ParleyPolicy is Parley's one access policy: every RPC of every service,
// and every hand-written route, with who may call it and the resource the
// caller must own. cmd/parley's policy test walks every registered
// service descriptor and route and fails on one missing here, so a new RPC
// cannot ship open by accident. Its TestPermissionMatrix calls every RPC
// and route as each kind of caller and needs a row (the request's target
// and the handler's code) for a new one in matrixRPCs.
//
// The principles (issue 12): an agent key acts as that agent only; a
// client key manages the client's agents, keys, routines and tools and
// reads its ledger; the operator may do anything, and services in one
// process call each other as the operator. Agora envelopes and discovery,
// PD serving and health are public by design. Registering a PD needs any
// valid key. RPCs only services call are the operator's.
//
// Rules naming no resource on negotiations/* and tasks/* (whose names do
// not carry their agent) admit the agent's and client's keys, and the
// owning service checks ownership itself.
func ParleyPolicy() Policy {
	own := Agent | Client | Operator // the agent itself, its client, the operator
	manage := Client | Operator      // the client that owns it, the operator
	const (
		reg  = "/parley.registry.v1.RegistryService/"
		disp = "/parley.dispatcher.v1.DispatcherService/"
		neg  = "/parley.negotiator.v1.NegotiatorService/"
		task = "/parley.tasks.v1.TasksService/"
	)
	p := Policy{
		// Registry: protocols.
		reg + "CreateProtocol":  {Allow: AnyKey},
		reg + "GetProtocol":     {Allow: Anyone},
		reg + "ListProtocols":   {Allow: Anyone},
		reg + "SearchProtocols": {Allow: Anyone},
		reg + "ResolveProtocol": {Allow: AnyKey}, // it fetches from the network
		reg + "SyncProtocols":   {Allow: Operator},
		// Registry: agents.
		reg + "CreateAgent":               {Allow: manage, Resource: "parent"},
		reg + "GetAgent":                  {Allow: own, Resource: "name"},
		reg + "ListAgents":                {Allow: manage, Resource: "parent"}, // clients/- is the operator's
		reg + "UpdateAgent":               {Allow: manage, Resource: "agent.name"},
		reg + "DeleteAgent":               {Allow: manage, Resource: "name"},
		reg + "AddSupportedProtocol":      {Allow: own, Resource: "name"},
		reg + "RemoveSupportedProtocol":   {Allow: own, Resource: "name"},
		reg + "AddUnsupportedProtocol":    {Allow: own, Resource: "name"},
		reg + "RemoveUnsupportedProtocol": {Allow: own, Resource: "name"},
		// Registry: clients and keys. CreateClient is open here because
		// the registry decides with --open-registration (operator only
		// without it).
		reg + "CreateClient":  {Allow: Anyone},
		reg + "GetClient":     {Allow: manage, Resource: "name"},
		reg + "ListClients":   {Allow: Operator},
		reg + "CreateKey":     {Allow: manage, Resource: "parent"},
		reg + "ListKeys":      {Allow: own, Resource: "parent"},
		reg + "DeleteKey":     {Allow: manage, Resource: "name"},
		reg + "RotateKey":     {Allow: own, Resource: "name"},
		reg + "IntrospectKey": {Allow: Operator},
		// Registry: connections. The acting agent is the caller: an agent
		// key acts as itself only. Lists are the agent's or its client's.
		// ListClientGroupMembers is any key here: the handler admits the
		// client's own keys (agent or client) and the operator.
		reg + "FollowAgent":             {Allow: Agent | Operator, Resource: "name"},
		reg + "UnfollowAgent":           {Allow: Agent | Operator, Resource: "name"},
		reg + "ListFollowers":           {Allow: own, Resource: "parent"},
		reg + "ListFollowing":           {Allow: own, Resource: "parent"},
		reg + "JoinClientGroup":         {Allow: Agent | Operator, Resource: "name"},
		reg + "LeaveClientGroup":        {Allow: Agent | Operator, Resource: "name"},
		reg + "ListClientGroupMembers":  {Allow: AnyKey},
		reg + "CheckDialoguePermission": {Allow: Operator}, // the dispatcher calls it
		// Registry: groups (issue 13). The acting agent is `name`: an agent
		// key acts as itself only; admin and membership rules are the
		// handlers'. Lists are the agent's or its client's. GetGroup and
		// SearchGroups take any key; the handlers hide restricted_private
		// groups. The distribution-list resolver and the notification
		// outbox are the dispatcher's.
		reg + "CreateGroup":            {Allow: Agent | Operator, Resource: "name"},
		reg + "UpdateGroup":            {Allow: Agent | Operator, Resource: "name"},
		reg + "GetGroup":               {Allow: AnyKey},
		reg + "SearchGroups":           {Allow: AnyKey},
		reg + "JoinGroup":              {Allow: Agent | Operator, Resource: "name"},
		reg + "LeaveGroup":             {Allow: Agent | Operator, Resource: "name"},
		reg + "SetGroupRegions":        {Allow: Agent | Operator, Resource: "name"},
		reg + "InviteToGroup":          {Allow: Agent | Operator, Resource: "name"},
		reg + "AnswerGroupJoinRequest": {Allow: Agent | Operator, Resource: "name"},
		reg + "AnswerGroupInvite":      {Allow: Agent | Operator, Resource: "name"},
		reg + "RemoveGroupMember":      {Allow: Agent | Operator, Resource: "name"},
		reg + "SetGroupMemberType":     {Allow: Agent | Operator, Resource: "name"},
		reg + "ListGroupMembers":       {Allow: Agent | Operator, Resource: "name"},
		reg + "ListAgentGroups":        {Allow: own, Resource: "parent"},
		reg + "ListGroupJoinRequests":  {Allow: Agent | Operator, Resource: "parent"},
		reg + "ListGroupInvites":       {Allow: own, Resource: "parent"},
		reg + "ResolveRecipients":      {Allow: Operator},
		reg + "ListNotifications":      {Allow: Operator},
		// Registry: identity. Every credential may ask whom it identifies.
		reg + "GetCaller": {Allow: AnyKey},

		// Dispatcher.
		disp + "GetRoutine":      {Allow: own, Resource: "name"},
		disp + "ListRoutines":    {Allow: own, Resource: "parent"},
		disp + "SetRoutine":      {Allow: manage, Resource: "routine.name"},
		disp + "SetTool":         {Allow: manage, Resource: "tool.name"},
		disp + "ListTools":       {Allow: own, Resource: "parent"},
		disp + "Send":            {Allow: own, Resource: "agent"},
		disp + "ListSendCounts":  {Allow: own, Resource: "parent"},
		disp + "DeliverEnvelope": {Allow: Operator}, // the Agora routes call it
		disp + "Connect":         {Allow: Agent | Operator},
		disp + "ExecuteStep":     {Allow: Operator}, // the tasks service calls it
		disp + "TestRoutine":     {Allow: AnyKey},
		// Dispatcher: the agent network's dialogues. The acting agent is
		// the caller: an agent key sends, replies and closes as itself
		// only; a client key cannot act as its agents here.
		disp + "SendMessage":           {Allow: Agent | Operator, Resource: "sender"},
		disp + "ReplyMessage":          {Allow: Agent | Operator, Resource: "sender"},
		disp + "BroadcastMessage":      {Allow: Agent | Operator, Resource: "sender"},
		disp + "CloseDialogue":         {Allow: Agent | Operator, Resource: "name"},
		disp + "CloseDialogueMessages": {Allow: Agent | Operator, Resource: "name"},
		disp + "CloseDialogueAgent":    {Allow: Agent | Operator, Resource: "name"},
		disp + "CloseAllDialogues":     {Allow: Agent | Operator, Resource: "agent"},
		// Dispatcher: service requests (issue 14): the consumer opens one
		// as itself only.
		disp + "NewRequest": {Allow: Agent | Operator, Resource: "sender"},
		// Dispatcher: orders (issue 14), read by their two parties only:
		// the agent named must be the caller, and the handler answers
		// NOT_FOUND to an agent that is not a party.
		disp + "GetOrder":   {Allow: Agent | Operator, Resource: "name"},
		disp + "ListOrders": {Allow: Agent | Operator, Resource: "parent"},
		// Dispatcher: the ledger provider's payments (issue 14). The payer
		// creates one as itself; payer and payee read it, each under its
		// own name (NOT_FOUND to others); the handler lets only the payee
		// capture.
		disp + "CreatePayment":  {Allow: Agent | Operator, Resource: "parent"},
		disp + "GetPayment":     {Allow: Agent | Operator, Resource: "name"},
		disp + "CapturePayment": {Allow: Agent | Operator, Resource: "name"},
		// Dispatcher: mailboxes. An agent key receives and acknowledges
		// its own agent's mailbox only; client keys do not (one stream per
		// agent, opened by the agent).
		disp + "ReceiveMessages":                                  {Allow: Agent | Operator, Resource: "agent"},
		disp + "AcknowledgeMessages":                              {Allow: Agent | Operator, Resource: "agent"},
		"GET /v1/clients/{client}/agents/{agent}/messages:stream": {Allow: Agent | Operator, Resource: "clients/{client}/agents/{agent}"},

		// Negotiator: each call spends the named agent's LLM budget.
		neg + "GetCostSummary":         {Allow: own, Resource: "agent"},
		neg + "ListLedgerEntries":      {Allow: own, Resource: "agent"},
		neg + "ComposeQuery":           {Allow: own, Resource: "agent"},
		neg + "ReplyNaturalLanguage":   {Allow: own, Resource: "agent"},
		neg + "ReplyWithProtocol":      {Allow: own, Resource: "agent"},
		neg + "ParseReply":             {Allow: own, Resource: "agent"},
		neg + "CheckSuitability":       {Allow: own, Resource: "agent"},
		neg + "StartNegotiation":       {Allow: own, Resource: "agent"},
		neg + "SynthesizeRoutine":      {Allow: own, Resource: "agent"},
		neg + "DeriveProtocol":         {Allow: AnyKey},
		neg + "GetNegotiationProtocol": {Allow: Anyone},
		neg + "GetThresholds":          {Allow: AnyKey},
		// A negotiation's name does not carry its agent: the negotiator
		// answers these for the negotiation's agent, its client and the
		// operator only (others get NOT_FOUND), and opens a receiving side
		// only for an agent the caller owns.
		neg + "ReceiveNegotiationMessage": {Allow: own},
		neg + "GetNegotiation":            {Allow: own},
		neg + "GetRoutineCandidate":       {Allow: Operator},
		neg + "ReportShadowResult":        {Allow: Operator},

		// Tasks (the v1 API; the Agent Protocol routes are below).
		task + "CreateTask": {Allow: own, Resource: "task.agent"},
		task + "ListTasks":  {Allow: own, Resource: "agent"},
		// The calls on an existing task: its agent, its client and the
		// operator (the tasks service checks, as a task's name does not
		// carry its agent; others get NOT_FOUND).
		task + "GetTask":        {Allow: own},
		task + "CancelTask":     {Allow: own},
		task + "CreateStep":     {Allow: own},
		task + "GetStep":        {Allow: own},
		task + "ListSteps":      {Allow: own},
		task + "WatchTask":      {Allow: own},
		task + "CreateArtifact": {Allow: own},
		task + "GetArtifact":    {Allow: own},
		task + "ListArtifacts":  {Allow: own},
		task + "ReadArtifact":   {Allow: own},

		// gRPC health is public; reflection needs a key.
		"/grpc.health.v1.Health/Check":                                   {Allow: Anyone},
		"/grpc.health.v1.Health/Watch":                                   {Allow: Anyone},
		"/grpc.health.v1.Health/List":                                    {Allow: Anyone},
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      {Allow: AnyKey},
		"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": {Allow: AnyKey},

		// Hand-written HTTP routes.
		"GET /healthz":                                    {Allow: Anyone},
		"GET /readyz":                                     {Allow: Anyone},
		"GET /metrics":                                    {Allow: Operator}, // serve.Options.MetricsPublic opens it
		"GET /protocols/{hash}":                           {Allow: Anyone},
		"GET /agora/{client}/{agent}/.wellknown":          {Allow: Anyone},
		"GET /agora/{client}/{agent}/wellknown":           {Allow: Anyone},
		"POST /agora/{client}/{agent}":                    {Allow: Anyone},
		"POST /agora/{client}/{agent}/{$}":                {Allow: Anyone},
		"POST /agora/{client}/{agent}/conversations/{id}": {Allow: Anyone},
		// A peer ends a conversation; its id is unguessable.
		"DELETE /agora/{client}/{agent}/conversations/{id}": {Allow: Anyone},
	}
	// The Agent Protocol routes are public by default, as the spec has no
	// authentication and its official suite sends none.
	for _, prefix := range []string{"", "/agents/{client}/{agent}"} {
		base := prefix + "/ap/v1/agent/tasks"
		for _, route := range []string{
			"POST " + base,
			"GET " + base,
			"GET " + base + "/{task_id}",
			"POST " + base + "/{task_id}",
			"GET " + base + "/{task_id}/events",
			"POST " + base + "/{task_id}/steps",
			"GET " + base + "/{task_id}/steps",
			"GET " + base + "/{task_id}/steps/{step_id}",
			"POST " + base + "/{task_id}/artifacts",
			"GET " + base + "/{task_id}/artifacts",
			"GET " + base + "/{task_id}/artifacts/{artifact_id}",
		} {
			p[route] = Rule{Allow: Anyone}
		}
	}
	return p
}
