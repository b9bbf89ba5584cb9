// Node's official Pub/Sub client through the streamsub gateway (PUBSUB_EMULATOR_HOST):
// create a topic and a subscription, publish COUNT messages with attributes and
// ordering keys, stream them back and ack them; print what happened as JSON.
'use strict';
const {PubSub} = require('@google-cloud/pubsub');

async function main() {
  const [project, countText] = process.argv.slice(2);
  const count = Number(countText);
  const pubsub = new PubSub({projectId: project});
  const [topic] = await pubsub.createTopic('node-orders');
  const [subscription] = await topic.createSubscription('node-billing', {
    enableMessageOrdering: true,
  });
  let notFound = null;
  try {
    await pubsub.topic('missing').get();
  } catch (error) {
    notFound = error.code; // 5 = NOT_FOUND
  }
  const ordered = pubsub.topic('node-orders', {messageOrdering: true});
  const published = await Promise.all(
    Array.from({length: count}, (_, i) =>
      ordered.publishMessage({
        data: Buffer.from(`node ${i}`),
        attributes: {index: String(i)},
        orderingKey: `key-${i % 10}`,
      })
    )
  );
  const received = {};
  await new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`timed out with ${Object.keys(received).length} messages`)),
      60000
    );
    subscription.on('message', message => {
      received[message.id] = {
        data: message.data.toString(),
        index: message.attributes.index,
        orderingKey: message.orderingKey,
      };
      message.ack();
      if (Object.keys(received).length >= count) {
        clearTimeout(timer);
        resolve();
      }
    });
    subscription.on('error', reject);
  });
  await subscription.close();
  await pubsub.close();
  process.stdout.write(JSON.stringify({notFound, published, received}) + '\n');
}

main().then(
  () => process.exit(0),
  error => {
    process.stderr.write(`${error.stack || error}\n`);
    process.exit(1);
  }
);
