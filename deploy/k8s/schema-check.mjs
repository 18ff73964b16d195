// Validates every object of a kubectl List (JSON) against the Kubernetes API schema of
// kubernetes-models. Exit 1 on any invalid object or an object kind it does not know.
import { readFileSync } from "node:fs";
import { Deployment } from "kubernetes-models/apps/v1/Deployment";
import { PersistentVolumeClaim } from "kubernetes-models/v1/PersistentVolumeClaim";
import { Service } from "kubernetes-models/v1/Service";

const models = { "apps/v1 Deployment": Deployment, "v1 Service": Service,
                 "v1 PersistentVolumeClaim": PersistentVolumeClaim };
const list = JSON.parse(readFileSync(process.argv[2], "utf8"));
let bad = 0;
for (const o of list.items) {
  const name = `${o.kind}/${o.metadata?.name}`;
  const Model = models[`${o.apiVersion} ${o.kind}`];
  if (!Model) {
    console.error(`schema: ${name}: no schema here for ${o.apiVersion} ${o.kind}`);
    bad++;
    continue;
  }
  try {
    new Model(o).validate();
  } catch (e) {
    console.error(`schema: ${name}: ${e.message}`);
    bad++;
  }
}
if (bad) process.exit(1);
console.log(`schema: ${list.items.length} objects valid`);
