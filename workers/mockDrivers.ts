import type { Drivers } from './setup';
import { MockStorage } from './storage/mock';
import { MockRuntime } from './runtime/mock';
import { MockNetwork } from './network/mock';
import { MockVolumes } from './storage/mockVolumes';

/** Drivers as a node uses them, with the mocks' hooks and records still in reach of a test. */
export interface MockDrivers extends Drivers {
  storage: MockStorage;
  runtime: MockRuntime;
  network: MockNetwork;
  volumes: MockVolumes;
}

/** A host in memory: jobs, box steps and reconciliation run on it with no root, ZFS or runc. */
export function createMockDrivers(): MockDrivers {
  return { storage: new MockStorage(), runtime: new MockRuntime(), network: new MockNetwork(), volumes: new MockVolumes() };
}
