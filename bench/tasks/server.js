// The reference: the Agent Protocol JavaScript SDK (agent-protocol@1.0.5,
// in memory) with a trivial step handler, on 127.0.0.1 and a free port.
// Prints "URL http://127.0.0.1:PORT" once listening.
const os = require('os');
const path = require('path');
const Agent = require('agent-protocol').default;

async function taskHandler(_taskId, _taskInput) {
  return async function stepHandler(stepInput) {
    return { output: 'echo: ' + stepInput, is_last: false };
  };
}

const workspace = process.env.WORKSPACE || path.join(os.tmpdir(), 'ap-bench-workspace');
const app = Agent.handleTask(taskHandler, { workspace }).build();
const srv = app.listen(0, '127.0.0.1', () => {
  console.log('URL http://127.0.0.1:' + srv.address().port);
});
